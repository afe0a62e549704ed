"""Sources, planned once in the main process: a source → the plan, and the plan to every rank.

Everything here reads storage (the pure model it builds is in `planning`):

- `planned`: a dataset's sources planned in one step (`plan_sources`), each a `PlannedSource`;
- `steps`: a source of files → `files.Planned`, step by step over the ranks (`plan_files`);
- `prepare`: its listing and read options (`prepare_source`), on rank 0;
- `files`: its plan finished (`finish_source`: filtered row counts, tokens, lengths, the
  decoded size of a row);
- `counting`: the rows, tokens and lengths of each chunk, read;
- `filters`: a row filter's validity and the columns it reads;
- `kept`: plans kept in ``cache_dir`` for a restart;
- `broadcast`: steps on rank 0 sent to every rank, and work shared by the ranks (`Spread`);
- `table_planning`: a table planned into the same `Planned`, the same way for every kind, from
  its kind's answers (`tables`: what planning asks of a table; `table_kinds`: the kinds by
  name; `table_deletes`: the arithmetic of deleted rows).
"""
