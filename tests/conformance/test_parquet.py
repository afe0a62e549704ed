"""The conformance suites on Parquet (the `Format` contract and the loader's resume contract),
and proof that each suite fails broken implementations."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import fsspec
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

import torch_dataloader_utils as tdu
from tests.conftest import MakeParquetDir, make_table, write_parquet
from torch_dataloader_utils.formats import FormatPlan, Listing, ReadOptions
from torch_dataloader_utils.formats.parquet import ParquetFormat
from torch_dataloader_utils.fs import FileSystemSpec, ListedFile, list_files
from torch_dataloader_utils.planning import Chunk
from torch_dataloader_utils.testing import (
    check_elastic_resume,
    check_format,
    check_reads,
    check_resume,
    check_schema,
)


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
    file = ListedFile(str(path), path.stat().st_size, str(root))
    with pytest.raises(AssertionError, match="no column 'row_id'"):
        check_schema(ParquetFormat(), file, fs=FileSystemSpec("file"), id_column="row_id")


# Broken formats, each wrong in one way; the suite must name the duty each one breaks.

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


class ReadNoRowsWithoutColumns(ParquetFormat):
    """Right until a read asks for no columns (a count): ORC once decoded no rows then."""

    def read(
        self, chunk: Chunk, row_start: int, row_stop: int, fs: FileSystemSpec, options: ReadOptions
    ) -> Batches:
        if options.columns != ():
            yield from super().read(chunk, row_start, row_stop, fs, options)


class Unpicklable(ParquetFormat):
    def __init__(self) -> None:
        super().__init__()
        self.lock = threading.Lock()

    def __reduce__(self) -> tuple[type[Unpicklable], tuple[()], dict[str, object]]:  # type: ignore[override]
        return (type(self), (), {"lock": self.lock})  # the lock is pickled too


class KeepsPlanOnItself(ParquetFormat):
    """Reads with what its own plan left on the instance: a copy that never planned (a
    worker's, another rank's) reads nothing."""

    planned = False

    def plan(self, listing: Listing, fs: FileSystemSpec, options: ReadOptions) -> FormatPlan:
        self.planned = True
        return super().plan(listing, fs, options)

    def read(
        self, chunk: Chunk, row_start: int, row_stop: int, fs: FileSystemSpec, options: ReadOptions
    ) -> Batches:
        if self.planned:
            yield from super().read(chunk, row_start, row_stop, fs, options)


def _last_chunk_one_row_short(plan: FormatPlan) -> FormatPlan:
    last = plan.chunks[-1]
    short = replace(
        last, num_rows=last.num_rows - 1, unit_rows=(*last.unit_rows[:-1], last.unit_rows[-1] - 1)
    )
    return replace(plan, chunks=[*plan.chunks[:-1], short])


class PlanOneRowShort(ParquetFormat):
    """Consistent chunks (unit_rows sum to num_rows) that count one row too few."""

    def plan(self, listing: Listing, fs: FileSystemSpec, options: ReadOptions) -> FormatPlan:
        return _last_chunk_one_row_short(super().plan(listing, fs, options))


class PlanNumRowsOffByOne(ParquetFormat):
    def plan(self, listing: Listing, fs: FileSystemSpec, options: ReadOptions) -> FormatPlan:
        plan = super().plan(listing, fs, options)
        first = plan.chunks[0]
        return replace(plan, chunks=[replace(first, num_rows=first.num_rows + 1), *plan.chunks[1:]])


class PlanReversed(ParquetFormat):
    def plan(self, listing: Listing, fs: FileSystemSpec, options: ReadOptions) -> FormatPlan:
        plan = super().plan(listing, fs, options)
        return replace(plan, chunks=plan.chunks[::-1])


class SplitLosesRows(ParquetFormat):
    """Right by default; drops a row only when asked to regroup."""

    def plan(self, listing: Listing, fs: FileSystemSpec, options: ReadOptions) -> FormatPlan:
        plan = super().plan(listing, fs, options)
        return _last_chunk_one_row_short(plan) if options.split_rows else plan


@pytest.mark.parametrize(
    ("broken", "message"),
    [
        (ReadDropsLastRow, r"rows \[0:128\): read 127 rows, not 128"),
        (ReadIgnoresRowStart, r"rows \[1:\d+\): not that slice"),
        (ReadFirstRowGroupOnly, r"read \d+ rows"),
        (ReadIgnoresColumns, r"yielded schema\n(.|\n)*not the plan's"),
        (ReadNothingAfterClose, r"read 0 rows"),
        (ReadNoRowsWithoutColumns, r"with columns=\(\): chunk .* read 0 rows, not 128"),
        (Unpicklable, r"Unpicklable or a chunk: no pickle with protocol 2"),
        (KeepsPlanOnItself, r"pickled before planning .* belongs in FormatPlan\.read_options"),
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


# --- the resume suite on Parquet loaders -----------------------------------------------------

# (rows, row group size) per file: uneven files and row groups; 1000 rows in all.
RESUME_FILES = [(170, 64), (0, 10), (512, 100), (300, 7), (18, 5)]
RESUME_ROWS = 1000


@pytest.fixture
def resume_source(tmp_path: Path) -> Path:
    start = 0
    for i, (rows, row_group) in enumerate(RESUME_FILES):
        ids = np.arange(start, start + rows)
        write_parquet(tmp_path / "data" / f"p{i}.parquet", ids, row_group_size=row_group)
        start += rows
    assert start == RESUME_ROWS
    return tmp_path / "data"


def resume_loader(root: Path, **options: Any) -> tdu.TabularDataLoader:
    options = {"batch_size": 45, "shuffle_seed": 3, "shuffle_block_size": 150, **options}
    if options.get("num_workers"):
        options.setdefault("multiprocessing_context", "fork")
        options.setdefault("timeout", 60)  # a stuck worker fails the test instead of hanging it
        options.setdefault("bundle_rows", 90)  # several messages per worker
    return tdu.create_dataloader(root, format="parquet", **options)


@pytest.mark.parametrize("num_workers", [0, 2])
@pytest.mark.parametrize("shuffle", [False, True])
def test_resume_suite(resume_source: Path, shuffle: bool, num_workers: int) -> None:
    check_resume(
        lambda: resume_loader(resume_source, shuffle=shuffle, num_workers=num_workers),
        expected_ids=range(RESUME_ROWS),
    )


def test_resume_suite_with_a_row_filter_and_drop_last(resume_source: Path) -> None:
    kept = [i for i in range(RESUME_ROWS) if i % 7 != 0]  # label is id % 7
    check_resume(
        lambda: resume_loader(
            resume_source, shuffle=True, num_workers=2, filters=pc.field("label") != 0
        ),
        epochs=3,
        positions=[0, 3, 11, 20, 21],
        expected_ids=kept,
    )
    check_resume(
        lambda: resume_loader(resume_source, shuffle=True, drop_last=True),
        positions=[2, 20, 21],
    )


@pytest.mark.filterwarnings("ignore:This DataLoader will create:UserWarning")  # 3 workers
@pytest.mark.parametrize(
    ("old", "new", "batches", "options"),
    [
        pytest.param((1, 2), (2, 3), 5, {}, id="more-ranks-and-workers"),
        pytest.param((3, 2), (1, 0), 2, {}, id="fewer-ranks-in-process"),
        pytest.param((2, 0), (3, 1), 4, {"drop_last": True}, id="drop-last"),
        pytest.param((2, 2), (3, 2), 3, {"filters": pc.field("label") != 0}, id="filter"),
        pytest.param((2, 1), (1, 3), 0, {}, id="before-any-batch"),
        pytest.param((2, 1), (3, 2), 12, {}, id="after-the-whole-epoch"),  # 12 batches a rank
    ],
)
def test_elastic_resume_suite(
    resume_source: Path,
    old: tuple[int, int],
    new: tuple[int, int],
    batches: int,
    options: dict[str, Any],
) -> None:
    def make(rank: int, world_size: int, num_workers: int) -> tdu.TabularDataLoader:
        return resume_loader(
            resume_source,
            shuffle=True,
            rank=rank,
            world_size=world_size,
            num_workers=num_workers,
            **options,
        )

    check_elastic_resume(make, old=old, new=new, batches=batches, epoch=1)


# Broken loaders, each wrong in one way; the resume suite must say what went wrong.


class ForgetsTheState(tdu.TabularDataLoader):
    def load_state_dict(self, state_dict: dict[str, Any], **kwargs: Any) -> None:
        pass


class ReplaysTheEpoch(tdu.TabularDataLoader):
    """Resumes the right epoch, from its first batch."""

    def load_state_dict(self, state_dict: dict[str, Any], **kwargs: Any) -> None:
        super().load_state_dict({**state_dict, "batches": 0}, **kwargs)


class SkipsABatch(tdu.TabularDataLoader):
    def load_state_dict(self, state_dict: dict[str, Any], **kwargs: Any) -> None:
        super().load_state_dict({**state_dict, "batches": state_dict["batches"] + 1}, **kwargs)


@pytest.mark.parametrize(
    ("broken", "message"),
    [
        (ForgetsTheState, r"epoch 0 resumed from its end: 23 batches, expected 0"),
        (SkipsABatch, r"epoch 0 from the initial state: 22 batches, expected 23; missing ids"),
        (ReplaysTheEpoch, r"epoch 0 resumed from its end: 23 batches, expected 0"),
    ],
)
def test_the_resume_suite_fails_broken_loaders(
    resume_source: Path, broken: type[tdu.TabularDataLoader], message: str
) -> None:
    def make() -> tdu.TabularDataLoader:
        return broken(tdu.StructuredDataset(resume_source, batch_size=45, shuffle=True))

    with pytest.raises(AssertionError, match=message):
        check_resume(make, expected_ids=range(RESUME_ROWS))


def test_the_elastic_suite_fails_a_loader_that_replays_the_epoch(resume_source: Path) -> None:
    def make(rank: int, world_size: int, num_workers: int) -> tdu.TabularDataLoader:
        dataset = tdu.StructuredDataset(
            resume_source, batch_size=45, shuffle=True, rank=rank, world_size=world_size
        )
        return ReplaysTheEpoch(dataset, num_workers=num_workers)

    with pytest.raises(AssertionError, match=r"rows read twice \(at most 0 allowed\)"):
        check_elastic_resume(make, old=(2, 0), new=(3, 0), batches=3)
