"""Delta Lake throughput: what reading a table through its log costs over reading its Parquet
files, in the same run.

One table written by deltalake (8 float32 columns and an int64 id, ``--rows`` rows in files of
500k rows). Timed, each the best of ``--rounds`` interleaved rounds:

- ``raw pyarrow``: ``pq.read_table`` of every data file (the limit), cut into
  ``--batch-size`` rows, columns to torch zero-copy, one process;
- ``ours parquet``: ``create_dataloader`` over the same files as a Parquet folder;
- ``ours delta``: ``create_dataloader(path, format="delta")``: the log read by deltalake,
  the same files through our Parquet path.

Both of ours shuffle, in-process, the second (warm) epoch timed; planning is timed apart.

Usage::

    python benchmarks/delta_read.py                # 2M rows
    python benchmarks/delta_read.py --rows 4000000
"""

from __future__ import annotations

import argparse
import tempfile
import time
import warnings
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import torch
from deltalake import write_deltalake

import torch_dataloader_utils as tdu


def make(root: Path, rows: int) -> Path:
    """The table: appended in parts of 500k rows (a data file each, deltalake's row groups)."""
    rng = np.random.default_rng(0)
    table = root / "events"
    for start in range(0, rows, 500_000):
        n = min(500_000, rows - start)
        cols = {"id": pa.array(np.arange(start, start + n))}
        cols |= {f"f{j}": pa.array(rng.random(n, dtype=np.float32)) for j in range(8)}
        write_deltalake(table, pa.table(cols), mode="append")
    return table


def raw(files: list[Path], batch_size: int) -> float:
    """Rows/s of reading the data files with pyarrow and cutting batches to torch."""
    rows, began = 0, time.perf_counter()
    for path in files:
        for batch in pq.read_table(path).to_batches(max_chunksize=batch_size):
            columns = zip(batch.schema.names, batch.columns, strict=True)
            {n: torch.from_numpy(c.to_numpy()) for n, c in columns}
            rows += batch.num_rows
    return rows / (time.perf_counter() - began)


def ours(path: Path, fmt: str, batch_size: int) -> tuple[float, float]:
    """Planning seconds, and rows/s of the second epoch of a shuffled in-process loader."""
    began = time.perf_counter()
    loader = tdu.create_dataloader(
        str(path), format=fmt, batch_size=batch_size, shuffle=True, num_workers=0
    )
    planning = time.perf_counter() - began
    rate = 0.0
    for epoch in range(2):
        loader.set_epoch(epoch)
        rows, began = 0, time.perf_counter()
        for batch in loader:
            rows += len(batch["id"])
        rate = rows / (time.perf_counter() - began)
    return planning, rate


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=2_000_000)
    parser.add_argument("--batch-size", type=int, default=1024)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    warnings.filterwarnings("ignore", message=".*not writable.*")  # zero-copy, read-only views
    with tempfile.TemporaryDirectory() as tmp:
        table = make(Path(tmp), args.rows)
        files = sorted(table.glob("*.parquet"))
        best: dict[str, float] = {}
        plans: dict[str, float] = {}
        for _ in range(args.rounds):
            best["raw"] = max(best.get("raw", 0.0), raw(files, args.batch_size))
            for fmt in ("parquet", "delta"):
                planning, rate = ours(table, fmt, args.batch_size)
                best[fmt] = max(best.get(fmt, 0.0), rate)
                plans[fmt] = min(plans.get(fmt, float("inf")), planning)
        print(f"{'reader':14} {'rows/s':>12} {'/ raw':>7} {'planning s':>11}")
        print(f"{'raw pyarrow':14} {best['raw']:12,.0f}")
        for fmt in ("parquet", "delta"):
            ratio = best[fmt] / best["raw"]
            print(f"{'ours ' + fmt:14} {best[fmt]:12,.0f} {ratio:7.2f} {plans[fmt]:11.3f}")
        print(f"delta / parquet: {best['delta'] / best['parquet']:.2f}")


if __name__ == "__main__":
    main()
