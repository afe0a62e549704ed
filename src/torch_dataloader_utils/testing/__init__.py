"""A conformance suite for `Format` implementations, shipped so that every format, ours or a
third party's, is tested the same way (fsspec's habit).

The checks are plain functions that raise `AssertionError` with a message naming the chunk, the
row range and what differed, so they run under pytest, unittest or a script alike. Write a few
small files in your format (several files, an empty one, native units of different sizes) with a
column identifying each row, then::

    from torch_dataloader_utils.testing import check_format

    def test_my_format_conforms(tmp_path):
        expected = write_my_files(tmp_path)  # a pyarrow.Table of everything written, in order
        check_format(MyFormat(), str(tmp_path), id_column="id", expected=expected)

``expected`` may be left out for formats ``pyarrow.dataset`` reads itself (``fmt.name`` one of
parquet, orc, ipc, arrow, feather, csv, json, jsonl). The smaller ``check_*`` functions check one
duty each, for a test that wants to point at one; `check_fork` (run by `check_format`) reads in a
child process forked after a read, as DataLoader workers are.

The resume contract of a loader is checked the same way: `check_resume` (exact resume on the
same topology) and `check_elastic_resume` (another number of ranks or workers) take a function
that builds a fresh loader::

    from torch_dataloader_utils.testing import check_resume

    def test_my_format_resumes(tmp_path):
        write_my_files(tmp_path)
        check_resume(lambda: create_dataloader(tmp_path, format=MyFormat(), batch_size=16,
                                               shuffle=True, num_workers=2, timeout=60))

A table source (a kind registered with `sources.table_kinds.register_table`) is checked with
`check_table`: its version pinned and fingerprinted, its row counts after deletes, every row
once across ranks and splits, clear errors (docs/how-to/add-a-source.md).
"""

from .conformance import (
    check_format,
    check_no_columns,
    check_pickle,
    check_plan,
    check_reads,
    check_row_ranges,
    check_schema,
    read_rows,
)
from .forks import check_fork
from .resume import check_elastic_resume, check_resume
from .tables import (
    check_table,
    check_table_chunks,
    check_table_errors,
    check_table_pinned,
    check_table_rows,
    check_table_splits,
    check_table_streams,
    check_table_version_change,
)

__all__ = [
    "check_elastic_resume",
    "check_fork",
    "check_format",
    "check_no_columns",
    "check_pickle",
    "check_plan",
    "check_reads",
    "check_resume",
    "check_row_ranges",
    "check_schema",
    "check_table",
    "check_table_chunks",
    "check_table_errors",
    "check_table_pinned",
    "check_table_rows",
    "check_table_splits",
    "check_table_streams",
    "check_table_version_change",
    "read_rows",
]

if __all__ != sorted(__all__):  # keep the public list curated and sorted
    raise ImportError("torch_dataloader_utils.testing.__all__ must be sorted")
