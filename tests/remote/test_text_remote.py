"""CSV and JSON Lines on S3 (SeaweedFS): plan-time scans and chunk reads are range requests
through the filesystem; a loader with 2 workers reads every row exactly once."""

from __future__ import annotations

import gzip
import json
import uuid
from collections import Counter
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.csv as pacsv
import pytest

import torch_dataloader_utils as tdu
from tests.services.seaweedfs import SeaweedFS

pytestmark = pytest.mark.remote

BUCKET = "tdu-text"
SIZES = (400, 0, 1500, 33)  # rows per file; the empty one is header-only (CSV) or 0 bytes
ROWS = sum(SIZES)


def table(lo: int, hi: int) -> pa.Table:
    ids = np.arange(lo, hi)
    text = [f'a "{i}",\nb' if i % 5 == 0 else f"t{i}" for i in ids]  # quoted newlines
    return pa.table({"id": ids, "x": ids * 0.25, "text": text})


@pytest.fixture(scope="module")
def text_data(seaweedfs: SeaweedFS, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The same rows as CSV, as JSON Lines and as gzipped CSV, uploaded under one prefix."""
    local = tmp_path_factory.mktemp("text")
    for sub in ("csv", "jsonl", "csvgz"):
        (local / sub).mkdir()
    start = 0
    for i, size in enumerate(SIZES):
        t = table(start, start + size)
        pacsv.write_csv(t, local / "csv" / f"part-{i}.csv")
        lines = "".join(json.dumps(row) + "\n" for row in t.to_pylist())
        (local / "jsonl" / f"part-{i}.jsonl").write_text(lines)
        data = (local / "csv" / f"part-{i}.csv").read_bytes()
        (local / "csvgz" / f"part-{i}.csv.gz").write_bytes(gzip.compress(data))
        start += size
    seaweedfs.create_bucket(BUCKET)
    fs = seaweedfs.filesystem()
    prefix = f"{BUCKET}/text-{uuid.uuid4().hex[:8]}"
    for path in sorted(local.rglob("*.*")):
        fs.put_file(str(path), f"{prefix}/{path.relative_to(local)}")
    fs.invalidate_cache()
    return {"url": f"s3://{prefix}", "storage_options": seaweedfs.s3fs_options()}


def read_ids(url: str, fmt: str, options: dict[str, Any], **kwargs: Any) -> list[int]:
    dl = tdu.create_dataloader(
        url,
        format=fmt,
        batch_size=100,
        num_workers=2,
        multiprocessing_context="fork",
        timeout=120,
        storage_options=options,
        **kwargs,
    )
    return [i for batch in dl for i in batch["id"].tolist()]


@pytest.mark.parametrize(
    ("sub", "fmt"), [("csv", "csv"), ("jsonl", "jsonl"), ("csvgz", "csv")], ids=str
)
def test_two_workers_read_every_row_once(text_data: dict[str, Any], sub: str, fmt: str) -> None:
    ids = read_ids(
        f"{text_data['url']}/{sub}",
        fmt,
        text_data["storage_options"],
        shuffle=True,
        format_options={"chunk_bytes": 8192},
    )
    assert Counter(ids) == Counter(range(ROWS))


def test_byte_range_chunks_on_s3(text_data: dict[str, Any]) -> None:
    dl = tdu.create_dataloader(
        f"{text_data['url']}/csv",
        format="csv",
        batch_size=64,
        num_workers=0,
        split_rows=97,
        storage_options=text_data["storage_options"],
    )
    chunks = dl.dataset.plan.chunks
    assert len(chunks) > 10 and all(c.num_rows <= 97 for c in chunks)
    ids = [i for batch in dl for i in batch["id"].tolist()]
    assert ids == list(range(ROWS))
    first = next(iter(dl))
    assert first["text"][0] == 'a "0",\nb'


def test_jsonl_plan_on_s3(text_data: dict[str, Any]) -> None:
    remote = tdu.create_dataloader(
        f"{text_data['url']}/jsonl",
        format="jsonl",
        batch_size=64,
        num_workers=0,
        storage_options=text_data["storage_options"],
        format_options={"chunk_bytes": 4096},
    )
    assert sum(c.num_rows for c in remote.dataset.plan.chunks) == ROWS
    assert remote.dataset.plan.schema.names == ["id", "x", "text"]
