"""Build the loader once in a parent, hand it to ranks started by torch.multiprocessing.spawn.

Run it from the repository root (CPU, gloo)::

    python examples/train_mp_spawn.py --ranks 2

What it shows:

- The parent (no process group, no ``RANK``) plans once: lists the files, reads the footers.
  The loader is pickled into each rank; each copy resolves its rank where it lands (the
  process group the rank joins), so each rank reads only its equal share.
- No ``set_epoch``: each pass after one that delivered batches reads the next epoch.
- Every rank writes the ids it read; the parent checks every row was read once per epoch.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import tempfile
from collections import Counter
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import torch.distributed as dist
import torch.multiprocessing as mp

import torch_dataloader_utils as tdu

ROWS = 4_000


def rank_main(rank: int, loader: tdu.TabularDataLoader, ranks: int, port: int, out: str) -> None:
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=ranks
    )
    try:
        epochs = [[batch["id"].tolist() for batch in loader] for _ in range(2)]
        Path(out, f"rank{rank}.json").write_text(json.dumps(epochs))
        dist.barrier()
    finally:
        dist.destroy_process_group()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="tdu-spawn-") as folder:
        spawned(args, Path(folder))


def spawned(args: argparse.Namespace, root: Path) -> None:
    """Write the data under ``root``, plan here once, read it in spawned ranks."""
    for i, ids in enumerate(np.array_split(np.arange(ROWS), 4)):
        pq.write_table(pa.table({"id": ids}), root / f"part-{i}.parquet", row_group_size=100)
    loader = tdu.create_dataloader(
        str(root), batch_size=64, shuffle=True, num_workers=args.workers
    )  # planned here, once
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(rank_main, args=(loader, args.ranks, port, str(root)), nprocs=args.ranks)

    results = [json.loads((root / f"rank{r}.json").read_text()) for r in range(args.ranks)]
    for epoch in range(2):
        counts = Counter(i for rank in results for batch in rank[epoch] for i in batch)
        batches = [len(rank[epoch]) for rank in results]
        duplicated = sum(counts.values()) - len(counts)
        print(
            f"epoch {epoch}: rows seen {len(counts)}, duplicated {duplicated}, "
            f"missing {ROWS - len(counts)}, batches per rank {batches}"
        )
    orders = {tuple(results[0][e][0]) for e in range(2)}
    print("a new order each epoch" if len(orders) == 2 else "the same order twice")


if __name__ == "__main__":
    main()
