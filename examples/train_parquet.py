"""Train a tiny classifier on a Parquet dataset with torch-dataloader-utils.

Run it from the repository root::

    python examples/train_parquet.py

It writes a small synthetic dataset (8 float features ``x0``..``x7`` and an integer ``label``) to
a temporary directory, reads it with ``create_dataloader`` (two worker processes, shuffled), and
trains a small MLP for two epochs, calling ``set_epoch`` before each one. It needs only the core
install and finishes in a few seconds on two CPU cores.
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import torch
from torch import nn

import torch_dataloader_utils as tdu

FEATURES = [f"x{i}" for i in range(8)]
NUM_CLASSES = 3
FILES = 4
ROWS_PER_FILE = 15_000
BATCH_SIZE = 512
EPOCHS = 2


def write_dataset(root: Path, *, seed: int = 0) -> None:
    """Write ``FILES`` Parquet files; the label is a (noisy) linear function of the features.

    The rows are sorted by label inside each file, so shuffling visibly matters.
    """
    rng = np.random.default_rng(seed)
    weights = rng.normal(size=(len(FEATURES), NUM_CLASSES)).astype(np.float32)
    for i in range(FILES):
        x = rng.normal(size=(ROWS_PER_FILE, len(FEATURES))).astype(np.float32)
        logits = x @ weights + rng.normal(scale=0.5, size=(ROWS_PER_FILE, NUM_CLASSES))
        label = logits.argmax(axis=1).astype(np.int64)
        order = np.argsort(label, kind="stable")
        columns = {name: x[order, j] for j, name in enumerate(FEATURES)}
        columns["label"] = label[order]
        # Small row groups give the planner several chunks per file to shuffle.
        pq.write_table(pa.table(columns), root / f"part-{i:03d}.parquet", row_group_size=5_000)


def main() -> None:
    torch.manual_seed(0)
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "train"
        root.mkdir()
        write_dataset(root)

        loader = tdu.create_dataloader(
            str(root),
            format="parquet",
            batch_size=BATCH_SIZE,
            columns=[*FEATURES, "label"],
            shuffle=True,
            num_workers=2,
        )
        print(f"{loader.dataset!r}, {len(loader)} batches per epoch")

        model = nn.Sequential(nn.Linear(len(FEATURES), 32), nn.ReLU(), nn.Linear(32, NUM_CLASSES))
        optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
        loss_fn = nn.CrossEntropyLoss()

        for epoch in range(EPOCHS):
            loader.set_epoch(epoch)  # a new chunk order and row shuffle every epoch
            started = time.perf_counter()
            total_loss, rows, correct = 0.0, 0, 0
            for batch in loader:
                # batch is a dict of tensors: one [rows] tensor per column.
                x = torch.stack([batch[name] for name in FEATURES], dim=1)
                y = batch["label"]
                logits = model(x)
                loss = loss_fn(logits, y)
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
                total_loss += loss.item() * len(y)
                correct += int((logits.argmax(dim=1) == y).sum())
                rows += len(y)
            seconds = time.perf_counter() - started
            print(
                f"epoch {epoch}: {rows} rows, loss {total_loss / rows:.4f}, "
                f"accuracy {correct / rows:.3f}, {seconds:.1f} s"
            )
        if rows != FILES * ROWS_PER_FILE:
            raise SystemExit(f"expected {FILES * ROWS_PER_FILE} rows per epoch, got {rows}")


if __name__ == "__main__":
    main()
