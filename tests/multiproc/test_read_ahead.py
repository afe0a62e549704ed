"""A DataLoader worker reads local files ahead in a thread only where the machine has a core
for it: with the workers of every local rank (``num_workers`` x ``LOCAL_WORLD_SIZE``) taking
all the cores, it reads in turn (`stream.pipeline._thread_pays`; ADR 0020, the prefetch
thread). Either way every row comes once."""

from __future__ import annotations

import os
import threading
from typing import Any

import pytest

import torch_dataloader_utils as tdu

pytestmark = [pytest.mark.timeout(120)]

CORES = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def _with_threads(batch: dict[str, Any]) -> dict[str, Any]:
    """A collate_fn (it runs in the worker): the batch's ids, and the names of the worker's
    threads as the batch is made."""
    return {"id": batch["id"].clone(), "threads": [t.name for t in threading.enumerate()]}


@pytest.mark.parametrize("local_ranks", [CORES, 1])
def test_a_worker_reads_ahead_only_with_a_core_to_spare(
    parquet_dir: Any, monkeypatch: pytest.MonkeyPatch, local_ranks: int
) -> None:
    # One worker a rank: a core to spare only while the ranks are fewer than the cores (on 2
    # cores, as in CI, one rank reads ahead and CORES ranks read in turn; on 1, both in turn).
    reads_ahead = local_ranks < CORES
    monkeypatch.setenv("LOCAL_WORLD_SIZE", str(local_ranks))
    root, rows = parquet_dir((700, 900, 400))
    loader = tdu.create_dataloader(
        str(root),
        batch_size=16,
        shuffle=True,
        shuffle_block_size=64,  # many blocks: the thread is still reading while batches come
        num_workers=1,
        collate_fn=_with_threads,
    )
    for epoch in range(2):
        loader.set_epoch(epoch)
        ids: list[int] = []
        threads: set[str] = set()
        for batch in loader:
            ids += batch["id"].tolist()
            threads.update(batch["threads"])
        assert sorted(ids) == list(range(rows))
        assert ("tdu-prefetch" in threads) is reads_ahead, sorted(threads)
