"""Train a tiny classifier on WebDataset tar shards with torch-dataloader-utils.

Run it from the repository root::

    python examples/train_webdataset.py                 # writes demo shards to a temp dir
    python examples/train_webdataset.py --shards 'data/train-{000000..000007}.tar'

Without ``--shards`` it writes a few shards with `torch_dataloader_utils.ShardWriter` (each
sample: an ``npy`` feature vector, a ``cls`` label and a ``json`` record; each shard gets its
``.idx`` index beside it), reads them with ``create_dataloader(format="webdataset")`` (two
worker processes, shuffled) and trains a small MLP for two epochs, calling ``set_epoch`` before
each. ``npy`` components arrive decoded and stacked into one tensor, ``cls`` as an int64 tensor.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from collections import Counter
from pathlib import Path

import numpy as np
import torch
from torch import nn

import torch_dataloader_utils as tdu
from torch_dataloader_utils.webdataset import ShardWriter

FEATURES = 8
NUM_CLASSES = 3
EPOCHS = 2


def write_shards(root: Path, samples: int, per_shard: int, *, seed: int = 0) -> str:
    """Write ``samples`` samples into shards of ``per_shard``; returns a brace pattern."""
    rng = np.random.default_rng(seed)
    weights = rng.normal(size=(FEATURES, NUM_CLASSES)).astype(np.float32)
    with ShardWriter(str(root / "train-%06d.tar"), maxcount=per_shard) as sink:
        for i in range(samples):
            x = rng.normal(size=FEATURES).astype(np.float32)
            label = int((x @ weights).argmax())
            sink.write({"__key__": f"{i:08d}", "npy": x, "cls": label, "json": {"id": i}})
        count = len(sink.shards)
    return str(root / f"train-{{000000..{count - 1:06d}}}.tar")


def train(source: str, *, num_workers: int) -> None:
    loader = tdu.create_dataloader(
        source,
        format="webdataset",
        columns=["__key__", "npy", "cls"],
        batch_size=256,
        shuffle=True,
        num_workers=num_workers,
    )
    total = loader.dataset.plan.num_rows
    print(f"{len(loader.dataset.plan.chunks)} chunks, {total} samples, {len(loader)} batches")
    model = nn.Sequential(nn.Linear(FEATURES, 32), nn.ReLU(), nn.Linear(32, NUM_CLASSES))
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    loss_fn = nn.CrossEntropyLoss()
    for epoch in range(EPOCHS):
        loader.set_epoch(epoch)  # a new shard order and sample shuffle every epoch
        started = time.perf_counter()
        seen: Counter[str] = Counter()
        correct = 0
        for batch in loader:
            x, y = batch["npy"], batch["cls"]  # [B, 8] float32 and [B] int64 tensors
            logits = model(x)
            loss = loss_fn(logits, y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            correct += int((logits.argmax(dim=1) == y).sum())
            seen.update(batch["__key__"])
        rows = sum(seen.values())
        once = len(seen) == total and all(n == 1 for n in seen.values())
        print(
            f"epoch {epoch}: {rows} samples, each read once: {once}, accuracy "
            f"{correct / max(rows, 1):.3f}, {time.perf_counter() - started:.1f} s"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shards", help="shards to read (dir, glob, brace pattern, URL)")
    parser.add_argument("--samples", type=int, default=20_000, help="demo samples to write")
    parser.add_argument("--per-shard", type=int, default=2_500)
    parser.add_argument("--num-workers", type=int, default=2)
    args = parser.parse_args()
    torch.manual_seed(0)
    if args.shards:
        train(args.shards, num_workers=args.num_workers)
        return
    with tempfile.TemporaryDirectory() as tmp:
        source = write_shards(Path(tmp), args.samples, args.per_shard)
        print(f"wrote {source}")
        train(source, num_workers=args.num_workers)


if __name__ == "__main__":
    main()
