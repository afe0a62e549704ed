"""How many threads each kind of storage work gets, in one place, with the reason for each.

These threads wait on storage (a request to an object store takes tens of milliseconds) or run
pyarrow and numpy code that releases the GIL. Planning runs once, in the main process, and
can use many. Reads run in every DataLoader worker of every rank, so their counts multiply by
the workers, and stay small.
"""

from __future__ import annotations

__all__ = [
    "AHEAD_THREADS",
    "COUNT_THREADS",
    "FETCH_THREADS",
    "PLAN_THREADS",
    "READ_THREADS",
    "SCAN_THREADS",
    "SOURCE_THREADS",
]

# Planning reads metadata: Parquet footers, ORC tails, IPC headers, tar indexes, Iceberg
# footers and delete files. On object storage each is one small request, so the threads spend
# their time waiting. Locally, pyarrow and numpy release the GIL.
PLAN_THREADS = 32

# A dataset of several sources (a mixture) plans them at once, each source in its own thread
# (`sources.planned.plan_sources`, without a process group of several ranks). Each source's
# planning runs its own threads too (PLAN_THREADS and the others here), so this only overlaps
# the sources' waits on listings and first footers, and stays small.
SOURCE_THREADS = 8

# Planning CSV and JSON Lines scans every byte of every file in 8 MiB range reads
# (`formats.text.format.SCAN_BYTES`), and numpy searches each for record ends. Each thread holds
# one, and the search is work, not waiting: half of PLAN_THREADS, so at most 16 range reads
# (128 MiB) at once.
SCAN_THREADS = 16

# Counting the rows that pass a row filter at plan time (`sources.counting.count_rows`) reads and
# decodes every chunk (the filter's columns only). Remote reads wait on storage, and pyarrow
# decodes without the GIL, so threads help; but each thread reads through its own copy of the
# format, which keeps an open file and its decoded batches, so fewer than PLAN_THREADS.
COUNT_THREADS = 8

# Parallel parts of byte ranges (`fs.ranges.RangeFetcher`), per process: a Parquet row group's
# column chunks, in parts of up to 8 MiB. An object store limits the throughput of one request,
# not how many run at once. Each thread holds at most one part.
FETCH_THREADS = 8

# Range requests started ahead of need on a `fs.ranges.ReadsAhead`'s own threads (WebDataset
# shards, about 8 MiB a request): one thread per read pending. Two keep a request in flight
# while another is sliced and decoded; more would only hold more bytes.
AHEAD_THREADS = 2

# Small pieces read ahead of need (`stream.read`), per process: a piece of a small file costs a
# few requests of tens of milliseconds each (identity check, footer, bytes) and few rows, so
# reading several at once is what keeps the first batch from waiting on every file of the first
# block in turn. Each thread holds one small piece (at most 2 MiB, by the estimate).
READ_THREADS = 16
