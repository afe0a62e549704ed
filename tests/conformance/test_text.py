"""The conformance suites on CSV and JSON Lines: the `Format` contract (byte-range chunks), the
loader's resume contracts, and loaders with real worker processes."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.csv as pacsv
import pytest

import torch_dataloader_utils as tdu
from torch_dataloader_utils.formats import Listing, ReadOptions
from torch_dataloader_utils.formats.text import CsvFormat, JsonFormat
from torch_dataloader_utils.fs import FileSystemSpec, list_files
from torch_dataloader_utils.planning import Topology
from torch_dataloader_utils.testing import check_elastic_resume, check_format, check_resume

# Rows per file, in name order: an empty file (header only for CSV), a big one cut into many
# blocks, uneven small ones. Ids run 0..ROWS-1 across the files.
SIZES = (170, 0, 600, 7, 223)
ROWS = sum(SIZES)


def rows_of(ids: range) -> pa.Table:
    n = np.asarray(ids, dtype=np.int64)
    texts = [f'say "{i}",\nthen {i}' if i % 4 == 0 else f"t{i}" for i in n]  # quoted newlines
    return pa.table({"id": n, "x": n * 0.5, "text": texts, "label": n % 7})


def write_csv_source(root: Path) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    start = 0
    for i, size in enumerate(SIZES):
        pacsv.write_csv(rows_of(range(start, start + size)), root / f"part-{i}.csv")
        start += size
    return root


def write_jsonl_source(root: Path) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    start = 0
    for i, size in enumerate(SIZES):
        with open(root / f"part-{i}.jsonl", "w", newline="") as f:
            for row in rows_of(range(start, start + size)).to_pylist():
                # Blank lines and CRLF: not records, and the counts must agree.
                f.write(json.dumps(row) + ("\r\n\n" if row["id"] % 9 == 0 else "\n"))
        start += size
    return root


@pytest.fixture
def csv_source(tmp_path: Path) -> Path:
    return write_csv_source(tmp_path / "csv")


@pytest.fixture
def jsonl_source(tmp_path: Path) -> Path:
    return write_jsonl_source(tmp_path / "jsonl")


EXPECTED = pa.table({"id": np.arange(ROWS)})


def test_csv_conformance(csv_source: Path) -> None:
    # pyarrow.dataset reads a header-only CSV as null columns, so the ids are passed.
    check_format(CsvFormat(chunk_bytes=1024), str(csv_source), id_column="id", expected=EXPECTED)


def test_csv_conformance_default_expected(tmp_path: Path) -> None:
    """pyarrow.dataset's own read of the files is the reference (no quoted newlines: it
    reads CSV without them)."""
    for i, (lo, hi) in enumerate([(0, 300), (300, 301), (301, 500)]):
        ids = np.arange(lo, hi)
        pacsv.write_csv(pa.table({"id": ids, "v": ids * 2}), tmp_path / f"p{i}.csv")
    check_format(CsvFormat(chunk_bytes=512), str(tmp_path), id_column="id")


def test_json_conformance(jsonl_source: Path) -> None:
    check_format(JsonFormat(chunk_bytes=4096), str(jsonl_source), id_column="id", expected=EXPECTED)


def test_one_big_file_has_many_blocks(csv_source: Path) -> None:
    fs = FileSystemSpec("file")
    files = [f for f in list_files(str(csv_source), fs) if f.path.endswith("part-2.csv")]
    plan = CsvFormat(chunk_bytes=1024).plan(Listing.of(files), fs, ReadOptions())
    assert len(plan.chunks) >= 10 and sum(c.num_rows for c in plan.chunks) == 600


def loader(root: Path, fmt: str, **options: Any) -> tdu.TabularDataLoader:
    options = {
        "batch_size": 45,
        "shuffle_seed": 3,
        "shuffle_block_size": 150,
        "format_options": {"chunk_bytes": 4096},
        **options,
    }
    if options.get("num_workers"):
        options.setdefault("multiprocessing_context", "fork")
        options.setdefault("timeout", 60)  # a stuck worker fails the test instead of hanging it
    return tdu.create_dataloader(root, format=fmt, **options)


@pytest.fixture(params=["csv", "jsonl"])
def source(request: pytest.FixtureRequest, tmp_path: Path) -> tuple[Path, str]:
    if request.param == "csv":
        return write_csv_source(tmp_path / "csv"), "csv"
    return write_jsonl_source(tmp_path / "jsonl"), "jsonl"


@pytest.mark.parametrize("num_workers", [0, 2])
def test_resume_suite(source: tuple[Path, str], num_workers: int) -> None:
    root, fmt = source
    check_resume(
        lambda: loader(root, fmt, shuffle=True, num_workers=num_workers),
        expected_ids=range(ROWS),
    )


def test_elastic_resume_suite(source: tuple[Path, str]) -> None:
    root, fmt = source

    def make(rank: int, world_size: int, num_workers: int) -> tdu.TabularDataLoader:
        return loader(
            root, fmt, shuffle=True, rank=rank, world_size=world_size, num_workers=num_workers
        )

    check_elastic_resume(make, old=(1, 2), new=(2, 1), batches=5, epoch=1)


@pytest.mark.parametrize(
    ("fmt", "context"), [("csv", "fork"), ("jsonl", "fork"), ("csv", "spawn"), ("jsonl", "spawn")]
)
def test_two_workers_two_shuffled_epochs(tmp_path: Path, fmt: str, context: str) -> None:
    root = (write_csv_source if fmt == "csv" else write_jsonl_source)(tmp_path / fmt)
    # Spawned workers are slow to start: persistent ones serve both epochs.
    dl = loader(
        root,
        fmt,
        shuffle=True,
        num_workers=2,
        multiprocessing_context=context,
        persistent_workers=context == "spawn",
    )
    orders = []
    for epoch in range(2):
        dl.dataset.set_epoch(epoch)
        ids = [i for batch in dl for i in batch["id"].tolist()]
        assert Counter(ids) == Counter(range(ROWS)), f"epoch {epoch}: not every row exactly once"
        orders.append(ids)
    assert orders[0] != orders[1] and orders[0] != sorted(orders[0])


def test_one_big_file_feeds_two_workers(tmp_path: Path) -> None:
    path = tmp_path / "one.csv"
    pacsv.write_csv(rows_of(range(2000)), path)
    dl = loader(path, "csv", num_workers=2, batch_size=100, output_format="arrow", bundle_rows=100)
    chunks = dl.dataset.plan.chunks
    assert {c.path for c in chunks} == {str(path)} and len(chunks) > 4
    # Each worker's stream, by the dataset's own assignment: both read rows of the one file,
    # and between them every row once (ids are the rows' positions in the file).
    offsets = np.cumsum([0] + [c.num_rows for c in chunks])
    streams = []
    for worker in range(2):
        pieces = dl.dataset.pieces(Topology(worker=worker, num_workers=2), 0)
        assert pieces and {chunks[p.chunk].path for p in pieces} == {str(path)}
        rows = [
            i for p in pieces for i in range(offsets[p.chunk] + p.start, offsets[p.chunk] + p.stop)
        ]
        streams.append(Counter(rows))
    assert all(streams) and streams[0] + streams[1] == Counter(range(2000))
    ids: list[int] = []
    for batch in dl:
        ids.extend(batch.column("id").to_pylist())
    assert Counter(ids) == Counter(range(2000))
