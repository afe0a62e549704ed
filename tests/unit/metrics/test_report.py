"""`metrics.report`: a loader's metrics before any pass, and ``across_ranks=True`` over two
real ranks (gloo): the sum over steps of the slowest and of the mean rank's wait, gathered
from each rank's own waits; refused without torch.distributed."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
import torch.multiprocessing as mp

import torch_dataloader_utils as tdu
from torch_dataloader_utils.cli import make_demo_dataset

pytestmark = pytest.mark.timeout(300)


def test_before_a_pass_everything_is_zero_and_across_ranks_needs_distributed(
    tmp_path: Path,
) -> None:
    loader = tdu.create_dataloader(str(make_demo_dataset(tmp_path, 2000)), num_workers=0)
    metrics = loader.metrics()
    assert metrics["batches"] == 0 and metrics["wait_s"] == 0 and metrics["read_s"] == 0
    with pytest.raises(RuntimeError, match=r"initialize torch\.distributed"):
        loader.metrics(across_ranks=True)


def _rank(rank: int, data: str, init: str, out: Any) -> None:
    import time

    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=2)
    loader = tdu.create_dataloader(data, batch_size=256, num_workers=0, rank=rank, world_size=2)
    ids = []
    halfway = None
    for step, batch in enumerate(loader):
        ids.extend(batch["id"].tolist())
        time.sleep(0.002 * (rank + 1))  # (the ranks' loops differ)
        if step == 3:
            halfway = loader.metrics(across_ranks=True)  # (every rank at the same step)
    final = loader.metrics(across_ranks=True)
    out.put((rank, ids, list(loader._metrics.waits.each), halfway, final))
    dist.destroy_process_group()


def test_across_ranks_gathers_the_slowest_and_mean_rank_wait_per_step(tmp_path: Path) -> None:
    data = str(make_demo_dataset(tmp_path / "data", 4000))
    init = f"file://{tmp_path / 'rendezvous'}"
    context = mp.get_context("spawn")
    out = context.Queue()
    ranks = [context.Process(target=_rank, args=(r, data, init, out)) for r in range(2)]
    for process in ranks:
        process.start()
    got = {}
    for _ in ranks:
        rank, ids, waits, halfway, final = out.get(timeout=240)
        got[rank] = (ids, waits, halfway, final)
    for process in ranks:
        process.join(60)
        assert process.exitcode == 0
    assert sorted(got[0][0] + got[1][0]) == list(range(4000))  # every row once
    waits0, waits1 = got[0][1], got[1][1]
    assert len(waits0) == len(waits1)
    slowest = sum(max(a, b) for a, b in zip(waits0, waits1, strict=True))
    mean = sum((a + b) / 2 for a, b in zip(waits0, waits1, strict=True))
    for rank in (0, 1):
        halfway, final = got[rank][2], got[rank][3]
        assert halfway["rank_steps"] == 4 and final["rank_steps"] == len(waits0)
        assert final["rank_wait_slowest_s"] == pytest.approx(slowest, rel=1e-5)
        assert final["rank_wait_mean_s"] == pytest.approx(mean, rel=1e-5)
        assert final["rank_wait_slowest_s"] >= final["rank_wait_mean_s"]
    assert os.path.exists(data)
