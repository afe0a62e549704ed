"""Two torch.distributed ranks (gloo) whose DataLoader workers are spawned processes.

The ranks know their rank only from the initialised process group (RANK/WORLD_SIZE are not in
the environment), which a spawned worker does not have: the dataset must carry the rank the
main process resolved, or every rank's workers read rank 0 of a world of one.
"""

from __future__ import annotations

import json
import os
import socket
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import torch.distributed as dist
import torch.multiprocessing as mp

import torch_dataloader_utils as tdu

pytestmark = [
    pytest.mark.slow,
    pytest.mark.timeout(180),
    pytest.mark.filterwarnings("ignore:This DataLoader will create:UserWarning"),
]

SIZES = (251, 400, 0, 150)  # 801 rows: one is left over for two ranks
ROWS = sum(SIZES)
BATCH = 64
WORLD_SIZE = 2


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _rank_main(rank: int, source: str, port: int, out: str) -> None:
    """One rank (a spawned process): join the group, read one epoch, write what it read."""
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"):
        os.environ.pop(name, None)  # the group alone says the rank (workers inherit this env)
    os.environ["GLOO_SOCKET_IFNAME"] = "lo"
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=WORLD_SIZE
    )
    try:
        loader = tdu.create_dataloader(
            source,
            format="parquet",
            batch_size=BATCH,
            shuffle=True,
            num_workers=2,
            multiprocessing_context="spawn",
            timeout=60,
        )
        loader.set_epoch(1)
        batches = [batch["id"].tolist() for batch in loader]
        result = {"rank": rank, "len": len(loader), "batches": batches}
        Path(out, f"rank-{rank}.json").write_text(json.dumps(result))
        dist.barrier()
    finally:
        dist.destroy_process_group()


def test_spawned_workers_of_each_rank_read_that_ranks_share(
    parquet_dir: Any, tmp_path: Path
) -> None:
    root, rows = parquet_dir(SIZES)
    assert rows == ROWS
    out = tmp_path / "out"
    out.mkdir()
    mp.start_processes(
        _rank_main,
        args=(str(root), free_port(), str(out)),
        nprocs=WORLD_SIZE,
        join=True,
        start_method="spawn",
    )
    results = [json.loads((out / f"rank-{r}.json").read_text()) for r in range(WORLD_SIZE)]
    assert [r["rank"] for r in results] == list(range(WORLD_SIZE))
    per_rank = [Counter(i for batch in r["batches"] for i in batch) for r in results]
    for counts in per_rank:
        assert counts and max(counts.values()) == 1  # no row twice within a rank
    assert not set(per_rank[0]) & set(per_rank[1])  # disjoint across ranks
    union = set(per_rank[0]) | set(per_rank[1])
    assert union <= set(range(ROWS))
    assert len(union) == ROWS - ROWS % WORLD_SIZE  # only the remainder is dropped
    assert sum(per_rank[0].values()) == sum(per_rank[1].values()) == ROWS // WORLD_SIZE
    counts = [len(r["batches"]) for r in results]
    assert counts[0] == counts[1]  # equal batch counts: DDP does not hang
    assert [r["len"] for r in results] == counts  # len(loader) is what each rank reads
