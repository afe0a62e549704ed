"""The conformance suite on ``ParquetFormat``, and proof that the suite fails broken formats."""

from __future__ import annotations

import threading
from collections.abc import Iterator, Sequence
from dataclasses import replace
from pathlib import Path

import fsspec
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests.conftest import MakeParquetDir, make_table, write_parquet
from torch_dataloader_utils.formats import FormatPlan, ReadOptions
from torch_dataloader_utils.formats.parquet import ParquetFormat
from torch_dataloader_utils.fs import FileSystemSpec, SourceFile, list_files
from torch_dataloader_utils.planning import Chunk
from torch_dataloader_utils.testing import check_format, check_reads, check_schema


def test_directory_with_an_empty_file_and_uneven_row_groups(parquet_dir: MakeParquetDir) -> None:
    root, _ = parquet_dir((250, 1000, 0, 333, 17), row_group_size=100)
    check_format(ParquetFormat(), str(root), id_column="id")


def test_row_group_sizes_differ_between_files(tmp_path: Path) -> None:
    start = 0
    for i, (rows, row_group) in enumerate([(40, 7), (300, 64), (0, 10), (90, 1000), (5, 1)]):
        write_parquet(
            tmp_path / f"p{i}.parquet", np.arange(start, start + rows), row_group_size=row_group
        )
        start += rows
    check_format(
        ParquetFormat(), str(tmp_path / "*.parquet"), id_column="id", columns=["name", "x", "id"]
    )


def test_empty_first_file_explicit_list_and_expected(tmp_path: Path) -> None:
    paths = [
        write_parquet(tmp_path / "b.parquet", np.arange(0), row_group_size=10),
        write_parquet(tmp_path / "a.parquet", np.arange(0, 120), row_group_size=50),
        write_parquet(tmp_path / "c.parquet", np.arange(120, 125), row_group_size=2),
    ]
    expected = make_table(np.arange(125))  # a list keeps its order: b, a, c
    check_format(ParquetFormat(), [str(p) for p in paths], id_column="id", expected=expected)


def test_fsspec_memory_filesystem() -> None:
    memory = fsspec.filesystem("memory")
    root = f"/conformance-{id(memory)}"
    try:
        for i, (lo, hi) in enumerate([(0, 150), (150, 151), (151, 400)]):
            with memory.open(f"{root}/part-{i}.parquet", "wb") as f:
                pq.write_table(make_table(np.arange(lo, hi)), f, row_group_size=60)
        check_format(ParquetFormat(), f"memory://{root}", id_column="id")
    finally:
        memory.rm(root, recursive=True)


def test_other_formats_must_pass_expected(parquet_dir: MakeParquetDir) -> None:
    class Unknown(ParquetFormat):
        name = "unknown-to-pyarrow"

    root, _ = parquet_dir((10,))
    with pytest.raises(ValueError, match="expected="):
        check_format(Unknown(), str(root), id_column="id")


def test_schema_needs_the_id_column(parquet_dir: MakeParquetDir) -> None:
    root, _ = parquet_dir((10,))
    (path,) = sorted(root.iterdir())
    file = SourceFile(str(path), path.stat().st_size, str(root))
    with pytest.raises(AssertionError, match="no column 'row_id'"):
        check_schema(ParquetFormat(), file, fs=FileSystemSpec("file"), id_column="row_id")


# Broken formats, each wrong in one way; the suite must name the duty each one breaks.

Files = Sequence[SourceFile]
Parts = Sequence[tuple[tuple[str, object], ...]]
Batches = Iterator[pa.RecordBatch]


class ReadDropsLastRow(ParquetFormat):
    def read(
        self, chunk: Chunk, row_start: int, row_stop: int, fs: FileSystemSpec, options: ReadOptions
    ) -> Batches:
        yield from super().read(chunk, row_start, max(row_start, row_stop - 1), fs, options)


class ReadIgnoresRowStart(ParquetFormat):
    def read(
        self, chunk: Chunk, row_start: int, row_stop: int, fs: FileSystemSpec, options: ReadOptions
    ) -> Batches:
        yield from super().read(chunk, 0, row_stop - row_start, fs, options)


class ReadFirstRowGroupOnly(ParquetFormat):
    """Right while a chunk is one row group: only regrouped plans expose it."""

    def read(
        self, chunk: Chunk, row_start: int, row_stop: int, fs: FileSystemSpec, options: ReadOptions
    ) -> Batches:
        first = chunk.unit_rows[0]
        yield from super().read(chunk, min(row_start, first), min(row_stop, first), fs, options)


class ReadIgnoresColumns(ParquetFormat):
    def read(
        self, chunk: Chunk, row_start: int, row_stop: int, fs: FileSystemSpec, options: ReadOptions
    ) -> Batches:
        yield from super().read(chunk, row_start, row_stop, fs, ReadOptions())


class ReadNothingAfterClose(ParquetFormat):
    closed = False

    def read(
        self, chunk: Chunk, row_start: int, row_stop: int, fs: FileSystemSpec, options: ReadOptions
    ) -> Batches:
        if not self.closed:
            yield from super().read(chunk, row_start, row_stop, fs, options)

    def close(self) -> None:
        super().close()
        self.closed = True


class Unpicklable(ParquetFormat):
    def __init__(self) -> None:
        super().__init__()
        self.lock = threading.Lock()

    def __reduce__(self) -> tuple[type[Unpicklable], tuple[()], dict[str, object]]:  # type: ignore[override]
        return (type(self), (), {"lock": self.lock})  # the lock is pickled too


def _last_chunk_one_row_short(plan: FormatPlan) -> FormatPlan:
    last = plan.chunks[-1]
    short = replace(
        last, num_rows=last.num_rows - 1, unit_rows=(*last.unit_rows[:-1], last.unit_rows[-1] - 1)
    )
    return replace(plan, chunks=[*plan.chunks[:-1], short])


class PlanOneRowShort(ParquetFormat):
    """Consistent chunks (unit_rows sum to num_rows) that count one row too few."""

    def plan(
        self, files: Files, partitions: Parts, fs: FileSystemSpec, options: ReadOptions
    ) -> FormatPlan:
        return _last_chunk_one_row_short(super().plan(files, partitions, fs, options))


class PlanNumRowsOffByOne(ParquetFormat):
    def plan(
        self, files: Files, partitions: Parts, fs: FileSystemSpec, options: ReadOptions
    ) -> FormatPlan:
        plan = super().plan(files, partitions, fs, options)
        first = plan.chunks[0]
        return replace(plan, chunks=[replace(first, num_rows=first.num_rows + 1), *plan.chunks[1:]])


class PlanReversed(ParquetFormat):
    def plan(
        self, files: Files, partitions: Parts, fs: FileSystemSpec, options: ReadOptions
    ) -> FormatPlan:
        plan = super().plan(files, partitions, fs, options)
        return replace(plan, chunks=plan.chunks[::-1])


class SplitLosesRows(ParquetFormat):
    """Right by default; drops a row only when asked to regroup."""

    def plan(
        self, files: Files, partitions: Parts, fs: FileSystemSpec, options: ReadOptions
    ) -> FormatPlan:
        plan = super().plan(files, partitions, fs, options)
        return _last_chunk_one_row_short(plan) if options.split_rows else plan


@pytest.mark.parametrize(
    ("broken", "message"),
    [
        (ReadDropsLastRow, r"rows \[0:128\): read 127 rows, not 128"),
        (ReadIgnoresRowStart, r"rows \[1:\d+\): not that slice"),
        (ReadFirstRowGroupOnly, r"read \d+ rows"),
        (ReadIgnoresColumns, r"yielded schema\n(.|\n)*not the plan's"),
        (ReadNothingAfterClose, r"read 0 rows"),
        (Unpicklable, r"Unpicklable or a chunk: no pickle with protocol 2"),
        (PlanOneRowShort, r"counts 1714 rows, not 1715"),
        (PlanNumRowsOffByOne, r"unit_rows disagree"),
        (PlanReversed, r"not canonical order"),
        (SplitLosesRows, r"split_rows=1\b.*counts 1714 rows"),
    ],
)
def test_the_suite_fails_broken_formats(
    parquet_dir: MakeParquetDir, broken: type[ParquetFormat], message: str
) -> None:
    root, rows = parquet_dir((300, 1000, 0, 400, 15), row_group_size=128)
    assert rows == 1715
    with pytest.raises(AssertionError, match=message):
        check_format(broken(), str(root), id_column="id")


def test_multi_row_group_chunks_are_read_only_when_regrouped(parquet_dir: MakeParquetDir) -> None:
    root, rows = parquet_dir((300, 40), row_group_size=128)
    fs = FileSystemSpec("file")
    files = list_files(str(root), fs)
    ids = list(range(rows))
    check_reads(
        ReadFirstRowGroupOnly(), files, fs=fs, options=ReadOptions(), id_column="id", ids=ids
    )
    with pytest.raises(AssertionError, match=r"part-000\.parquet \[0:3\) rows \[0:300\): read 128"):
        check_reads(
            ReadFirstRowGroupOnly(),
            files,
            fs=fs,
            options=ReadOptions(split_rows=300),
            id_column="id",
            ids=ids,
        )
