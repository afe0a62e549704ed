"""Loader-level interoperability with webdataset 1.0.2: the same samples either way.

Shards written by ``webdataset.ShardWriter`` read by ``create_dataloader(format="webdataset")``
give exactly what ``wds.WebDataset(...).decode()`` yields (keys, and each extension's bytes or
decoded value); shards written by our `ShardWriter` read by webdataset give what we wrote.
"""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import webdataset as wds

import torch_dataloader_utils as tdu
from torch_dataloader_utils.webdataset.writer import ShardWriter

SAMPLES = 57


def sample(i: int) -> dict[str, Any]:
    out = io.BytesIO()
    np.save(out, np.arange(i % 4 + 1, dtype=np.float32) * i)
    return {
        "__key__": f"dir/sample{i:04d}",
        "cls": i % 10,
        "txt": f"caption {i} ünïcode",
        "json": {"i": i, "tags": ["a"] * (i % 3)},
        "npy": out.getvalue(),
        "seg.bin": bytes([i % 256]) * (i * 37 % 2000),
    }


def ours(source: Any) -> dict[str, dict[str, Any]]:
    loader = tdu.create_dataloader(
        source,
        format="webdataset",
        output_format="dict",
        batch_size=16,
        shuffle=False,
        num_workers=0,
        format_options={"index_cache_dir": ""},
    )
    rows: dict[str, dict[str, Any]] = {}
    for batch in loader:
        for r, key in enumerate(batch["__key__"]):
            assert key not in rows  # every sample once
            rows[key] = {k: v[r] for k, v in batch.items() if k not in ("__key__", "__url__")}
    return rows


def theirs(urls: list[str]) -> dict[str, dict[str, Any]]:
    dataset = wds.WebDataset(urls, shardshuffle=False, empty_check=False).decode()
    rows: dict[str, dict[str, Any]] = {}
    for s in dataset:
        assert s["__key__"] not in rows
        rows[s["__key__"]] = {k: v for k, v in s.items() if not k.startswith("__")}
    return rows


def same(a: dict[str, dict[str, Any]], b: dict[str, dict[str, Any]]) -> None:
    assert list(a) == list(b)  # keys, in the same order
    for key, row in a.items():
        assert sorted(row) == sorted(b[key]), key
        for ext, value in row.items():
            other = b[key][ext]
            if isinstance(value, np.ndarray):
                assert value.dtype == other.dtype and np.array_equal(value, other), (key, ext)
            else:
                assert value == other and type(value) is type(other), (key, ext)


def test_shards_written_by_webdataset(tmp_path: Path) -> None:
    pattern = str(tmp_path / "wds-%03d.tar")
    with wds.ShardWriter(pattern, maxcount=20, verbose=0) as sink:
        for i in range(SAMPLES):
            sink.write(sample(i))
    urls = sorted(str(p) for p in tmp_path.glob("wds-*.tar"))
    assert len(urls) == 3
    got, want = ours(urls), theirs(urls)
    assert len(got) == SAMPLES
    same(got, want)
    assert got["dir/sample0005"]["cls"] == 5 and got["dir/sample0005"]["json"]["i"] == 5


@pytest.mark.parametrize("index", [True, False])
def test_shards_written_by_us(tmp_path: Path, index: bool) -> None:
    pattern = str(tmp_path / "ours-%03d.tar")
    with ShardWriter(pattern, maxcount=25, index=index) as sink:
        for i in range(SAMPLES):
            sink.write(sample(i))
    urls = sorted(str(p) for p in tmp_path.glob("ours-*.tar"))
    assert len(urls) == 3 and all(Path(u[:-4] + ".idx").exists() == index for u in urls)
    got, want = ours(str(tmp_path / "ours-{000..002}.tar")), theirs(urls)
    assert len(want) == SAMPLES
    same(got, want)
