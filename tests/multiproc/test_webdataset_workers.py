"""WebDataset shards read by real DataLoader workers (fork and spawn): every sample once."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import torch
import webdataset as wds

import torch_dataloader_utils as tdu

pytestmark = [
    pytest.mark.timeout(120),
    pytest.mark.filterwarnings("ignore:This DataLoader will create:UserWarning"),
]

SHARDS = (120, 0, 45, 200)
KEYS = [f"s{s}-{i:04d}" for s, n in enumerate(SHARDS) for i in range(n)]


@pytest.fixture(scope="module")
def shards(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("wds")
    for s, n in enumerate(SHARDS):
        with wds.TarWriter(str(root / f"shard-{s:03d}.tar")) as writer:
            for i in range(n):
                writer.write({"__key__": f"s{s}-{i:04d}", "cls": i % 4, "bin": b"x" * (i % 900)})
    return root


def read(loader: Any) -> list[str]:
    """The keys of one pass, checking each batch's classes arrive as one int64 tensor."""
    keys = []
    for batch in loader:
        assert batch["cls"].dtype == torch.int64 and len(batch["cls"]) == len(batch["__key__"])
        keys.extend(batch["__key__"])
    return keys


@pytest.mark.parametrize("context", ["fork", "spawn"])
def test_two_workers_shuffled_epochs(shards: Path, tmp_path: Path, context: str) -> None:
    loader = tdu.create_dataloader(
        str(shards),
        format="webdataset",
        batch_size=16,
        shuffle=True,
        num_workers=2,
        multiprocessing_context=context,
        split_rows=50,
        timeout=60,
        format_options={"index_cache_dir": str(tmp_path / "cache")},
    )
    orders = []
    for epoch in range(2):
        loader.set_epoch(epoch)
        keys = read(loader)
        assert Counter(keys) == Counter(KEYS), f"epoch {epoch}: not every sample exactly once"
        orders.append(keys)
    assert orders[0] != orders[1]  # reshuffled


def test_one_shard_split_across_two_workers(shards: Path) -> None:
    """A single shard, one chunk: both workers read samples of it (split at sample bounds)."""
    shard = shards / "shard-003.tar"
    loader = tdu.create_dataloader(
        str(shard),
        format="webdataset",
        batch_size=10,
        shuffle=False,
        num_workers=2,
        multiprocessing_context="fork",
        timeout=60,
        format_options={"index_cache_dir": ""},
    )
    assert len(loader.dataset.plan.chunks) == 1
    batches = [list(batch["__key__"]) for batch in loader]
    keys = [k for batch in batches for k in batch]
    assert Counter(keys) == Counter(k for k in KEYS if k.startswith("s3-"))
    # Workers alternate batches: worker 0 reads the first half of the shard, worker 1 the
    # second, so the first two batches come from both halves.
    assert batches[0][0] == "s3-0000" and batches[1][0] == "s3-0100"
