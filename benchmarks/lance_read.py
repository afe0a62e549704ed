"""Lance throughput: ours against pylance's own scan on the same dataset, in the same run.

pylance: ``LanceDataset.to_batches`` over the whole dataset (deletion files applied), cut into
``--batch-size`` rows, numeric columns to torch zero-copy, one process. Ours:
``create_dataloader(path, format="lance")`` with shuffle on, ``num_workers`` 0, 2 forked
(reading through each worker's reader process: pylance is not fork-safe) and 2 spawned, the
second (warm) epoch timed. Prints rows/s and ours / pylance.

Usage::

    python benchmarks/lance_read.py                # 1M rows
    python benchmarks/lance_read.py --rows 4000000
"""

from __future__ import annotations

import argparse
import tempfile
import time
import warnings
from pathlib import Path

import lance
import numpy as np
import pyarrow as pa
import torch

import torch_dataloader_utils as tdu


def make(root: Path, rows: int) -> str:
    """8 float32 columns and an int64 id in fragments of 250k rows, every 10th row deleted."""
    rng = np.random.default_rng(0)
    cols = {"id": pa.array(np.arange(rows))}
    cols |= {f"f{j}": pa.array(rng.random(rows, dtype=np.float32)) for j in range(8)}
    uri = str(root / "bench.lance")
    lance.write_dataset(pa.table(cols), uri, max_rows_per_file=250_000)
    lance.dataset(uri).delete("id % 10 = 0")
    return uri


def to_torch(batch: pa.RecordBatch) -> dict[str, torch.Tensor]:
    columns = zip(batch.schema.names, batch.columns, strict=True)
    return {n: torch.from_numpy(c.to_numpy()) for n, c in columns}


def raw(uri: str, batch_size: int) -> float:
    """Rows/s of pylance's scan of the dataset, in ``batch_size``-row slices."""
    rows, began = 0, time.perf_counter()
    for batch in lance.dataset(uri).to_batches():
        for at in range(0, batch.num_rows, batch_size):
            to_torch(batch.slice(at, batch_size))
        rows += batch.num_rows
    return rows / (time.perf_counter() - began)


def ours(uri: str, workers: int, context: str | None, batch_size: int) -> float:
    """Rows/s of the second epoch of a shuffled loader."""
    loader = tdu.create_dataloader(
        uri,
        format="lance",
        batch_size=batch_size,
        shuffle=True,
        num_workers=workers,
        persistent_workers=workers > 0,
        multiprocessing_context=context,
    )
    rate = 0.0
    for epoch in range(2):
        loader.set_epoch(epoch)
        rows, began = 0, time.perf_counter()
        for batch in loader:
            rows += len(batch["id"])
        rate = rows / (time.perf_counter() - began)
    return rate


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--batch-size", type=int, default=1024)
    args = parser.parse_args()
    warnings.filterwarnings("ignore", message=".*not writable.*")  # zero-copy, read-only views
    warnings.filterwarnings("ignore", message="lance is not fork-safe")
    with tempfile.TemporaryDirectory() as tmp:
        uri = make(Path(tmp), args.rows)
        limit = max(raw(uri, args.batch_size) for _ in range(2))
        print(f"{'reader':16} {'rows/s':>12}  ours / pylance")
        print(f"{'pylance scan':16} {limit:12,.0f}")
        for name, workers, context in (
            ("ours w=0", 0, None),
            ("ours w=2 fork", 2, "fork"),
            ("ours w=2 spawn", 2, "spawn"),
        ):
            rate = ours(uri, workers, context, args.batch_size)
            print(f"{name:16} {rate:12,.0f}  {rate / limit:.2f}")


if __name__ == "__main__":
    main()
