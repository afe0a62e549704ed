"""Read through torchdata's StatefulDataLoader (torchtitan/torchtune style), stop, resume exactly.

Run it from the repository root::

    python examples/train_torchdata.py

What it shows:

- A `StructuredDataset` goes straight into ``StatefulDataLoader(dataset, batch_size=None)``:
  the dataset yields whole batches, already shuffled and cut for this rank and worker.
- The dataset implements torchdata's ``Stateful`` protocol, so ``loader.state_dict()`` holds
  each worker's stream position and epoch: ``load_state_dict`` seeks, nothing is read twice.
- No ``set_epoch`` anywhere: each pass after one that delivered batches reads the next epoch,
  and the resumed job first finishes the epoch it saved.
- Resume with the same ``num_workers`` (torchdata gives each worker its own state back).
"""

from __future__ import annotations

import argparse
import tempfile
from collections import Counter
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from torchdata.stateful_dataloader import StatefulDataLoader

import torch_dataloader_utils as tdu

ROWS = 5_000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--data", type=Path, help="the data's folder (default: a temporary one, removed after)"
    )
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args()
    if args.data is not None:
        train(args)
        return
    with tempfile.TemporaryDirectory(prefix="tdu-torchdata-") as folder:
        args.data = Path(folder) / "data"
        train(args)


def train(args: argparse.Namespace) -> None:
    """Write the data under ``args.data`` unless it is there, stop epoch 0, resume."""
    if not args.data.exists():
        args.data.mkdir(parents=True)
        for i, ids in enumerate(np.array_split(np.arange(ROWS), 4)):
            pq.write_table(pa.table({"id": ids}), args.data / f"part-{i}.parquet")

    def build() -> StatefulDataLoader:
        dataset = tdu.StructuredDataset(str(args.data), "parquet", batch_size=64, shuffle=True)
        return StatefulDataLoader(dataset, batch_size=None, num_workers=args.workers)

    counts: dict[int, Counter[int]] = {0: Counter(), 1: Counter()}
    loader = build()
    for step, batch in enumerate(loader):  # epoch 0, interrupted after 30 batches
        counts[0].update(batch["id"].tolist())
        if step == 29:
            state = loader.state_dict()  # save it with the model in a real job
            break
    print("stopped after 30 batches of epoch 0")

    loader = build()  # a new job
    loader.load_state_dict(state)
    for epoch in (0, 1):  # the rest of epoch 0, then all of epoch 1
        for batch in loader:
            counts[epoch].update(batch["id"].tolist())
    ok = all(c == Counter(range(ROWS)) for c in counts.values())
    print("every row read once in each epoch, across the resume" if ok else f"WRONG: {counts}")


if __name__ == "__main__":
    main()
