"""Sources, planned once in the main process: a source → the plan, and the plan to every rank.

Everything here reads storage (the pure model it builds is in `planning`):

- `files`: a source of files → `Planned` (listing, footers, filtered row counts, the decoded
  size of a row);
- `counting`: the rows of each chunk that pass the row filter;
- `filters`: a row filter's validity and the columns it reads;
- `broadcast`: plan on rank 0 and send the result to every rank (`plan_once`).

Iceberg tables are planned by `iceberg.planning` into the same `Planned`.
"""
