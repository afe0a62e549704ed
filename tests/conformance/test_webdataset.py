"""The format contract and the resume contract on WebDataset shards."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
import webdataset as wds

import torch_dataloader_utils as tdu
from torch_dataloader_utils.formats import Listing, ReadOptions
from torch_dataloader_utils.fs import FileSystemSpec, list_files
from torch_dataloader_utils.testing import check_elastic_resume, check_format, check_resume
from torch_dataloader_utils.testing.conformance import (
    check_no_columns,
    check_pickle,
    check_reads,
)
from torch_dataloader_utils.webdataset.format import WebDatasetFormat

# Samples per shard: uneven, and one empty shard (not the first: the contract compares the
# plan's schema with the first file's).
SHARDS = (23, 40, 0, 9, 31)
ROWS = sum(SHARDS)


def write_shards(root: Path, sizes: tuple[int, ...] = SHARDS, *, start: int = 0) -> list[int]:
    """Shards written by webdataset's TarWriter; sample ``i`` holds ``id`` (its id as text),
    ``cls``, ``txt`` and a ``bin`` payload of ``i % 7 * 300`` bytes. Returns the ids."""
    root.mkdir(parents=True, exist_ok=True)
    ids = []
    for s, size in enumerate(sizes):
        with wds.TarWriter(str(root / f"shard-{s:03d}.tar")) as writer:
            for i in range(start, start + size):
                writer.write(
                    {
                        "__key__": f"sample{i:05d}",
                        "id": str(i),
                        "cls": i % 5,
                        "txt": f"text {i}",
                        "bin": bytes([i % 251]) * (i % 7 * 300),
                    }
                )
                ids.append(i)
        start += size
    return ids


@pytest.fixture
def shards(tmp_path: Path) -> tuple[Path, list[int]]:
    return tmp_path / "shards", write_shards(tmp_path / "shards")


def test_conformance(shards: tuple[Path, list[int]], tmp_path: Path) -> None:
    root, ids = shards
    fmt = WebDatasetFormat(index_cache_dir=str(tmp_path / "cache"))
    check_format(fmt, str(root), id_column="id", expected=pa.table({"id": ids}))


def test_conformance_with_key_as_id_and_alternatives(
    shards: tuple[Path, list[int]], tmp_path: Path
) -> None:
    root, ids = shards
    fmt = WebDatasetFormat(index_cache_dir="", missing_component="empty")
    keys = pa.table({"__key__": [f"sample{i:05d}" for i in ids]})
    check_format(fmt, str(root), id_column="__key__", expected=keys, columns=["png;bin", "__key__"])


def test_conformance_skipping_samples(tmp_path: Path) -> None:
    """With missing_component="skip", chunks hold gaps of skipped samples."""
    root = tmp_path / "gaps"
    root.mkdir()
    kept = []
    for s, size in enumerate((30, 12)):
        with wds.TarWriter(str(root / f"s{s}.tar")) as writer:
            for i in range(size):
                sample: dict[str, Any] = {"__key__": f"s{s}-{i:03d}", "id": str(100 * s + i)}
                if i % 3:
                    sample["cls"] = i
                    kept.append(100 * s + i)
                writer.write(sample)
    fmt = WebDatasetFormat(index_cache_dir="", missing_component="skip")
    # Not check_format: its columns=() check expects the rows of the full projection, but
    # "skip" leaves out samples lacking a *selected* component, and columns=() selects none.
    fs = FileSystemSpec("file")
    files = list_files(str(root), fs)
    plan = check_reads(fmt, files, fs=fs, options=ReadOptions(), id_column="id", ids=kept)
    chunk = next(c for c in plan.chunks if c.num_rows)
    reading = plan.read_options or ReadOptions()
    check_pickle(fmt, chunk, fs=fs, options=reading, schema=plan.schema)
    for options in (
        ReadOptions(split_rows=1),
        ReadOptions(split_rows=7),
        ReadOptions(split_bytes=40),
        ReadOptions(columns=("cls", "id")),
        ReadOptions(columns=("id", "cls"), split_rows=5),
    ):
        check_reads(fmt, files, fs=fs, options=options, id_column="id", ids=kept)
    check_no_columns(fmt, files, fs=fs, num_rows=42)  # every sample: none lacks a component
    # A chunk planned with ("cls", "id") read with fewer columns (how the loader counts a
    # filter's rows: the plan's read options, other columns) still holds the planned rows.
    plan = fmt.plan(Listing.of(files), fs, ReadOptions(columns=("cls", "id")))
    assert plan.read_options is not None
    counting = dataclasses.replace(plan.read_options, columns=())
    read = [
        batch.num_rows
        for chunk in plan.chunks
        for batch in fmt.read(chunk, 0, chunk.num_rows, fs, counting)
    ]
    assert sum(read) == len(kept) == sum(c.num_rows for c in plan.chunks)


def resume_loader(root: Path, **options: Any) -> tdu.TabularDataLoader:
    options = {"batch_size": 10, "shuffle_seed": 3, "shuffle_block_size": 25, **options}
    if options.get("num_workers"):
        options.setdefault("multiprocessing_context", "fork")
        options.setdefault("timeout", 60)
    return tdu.create_dataloader(
        str(root),
        format="webdataset",
        columns=["id", "cls"],
        split_rows=16,
        format_options={"index_cache_dir": str(root.parent / "cache")},
        **options,
    )


@pytest.mark.timeout(120)
@pytest.mark.parametrize("num_workers", [0, 2])
def test_resume_suite(shards: tuple[Path, list[int]], num_workers: int) -> None:
    root, ids = shards
    check_resume(
        lambda: resume_loader(root, shuffle=True, num_workers=num_workers), expected_ids=ids
    )


@pytest.mark.timeout(120)
@pytest.mark.filterwarnings("ignore:This DataLoader will create:UserWarning")
def test_elastic_resume_suite(shards: tuple[Path, list[int]]) -> None:
    root, _ = shards

    def make(rank: int, world_size: int, num_workers: int) -> tdu.TabularDataLoader:
        return resume_loader(
            root, shuffle=True, rank=rank, world_size=world_size, num_workers=num_workers
        )

    check_elastic_resume(make, old=(1, 2), new=(2, 3), batches=4, epoch=1)
