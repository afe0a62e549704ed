"""The data order as an object: looking up a batch's rows (``loader.rows_at``) against reading
the same rows by hand (pyarrow: the row groups they are in, then a take), in the same run.

Usage::

    python benchmarks/order.py                  # 200 files of 5,000 rows, batches of 1,024
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

import torch_dataloader_utils as tdu

HERE = Path(__file__).resolve().parent
DATA = HERE / ".data"


def make(files: int, rows: int) -> Path:
    root = DATA / f"order-{files}x{rows}"
    if not (root / "_done").exists():
        root.mkdir(parents=True, exist_ok=True)
        rng = np.random.default_rng(0)
        for f in range(files):
            ids = np.arange(rows, dtype=np.int64) + f * rows
            table = pa.table({"id": ids, "x": rng.random(rows), "y": rng.random((rows,))})
            pq.write_table(table, root / f"part-{f:04d}.parquet", row_group_size=1000)
        (root / "_done").touch()
    return root


def by_hand(table: pa.Table) -> pa.Table:
    """The same rows read with pyarrow from their files' row groups, in the same order."""
    files = table.column("__file__").to_pylist()
    rows = table.column("__row__").to_numpy()
    parts, order = [], []
    for path in dict.fromkeys(files):
        mine = np.flatnonzero(np.asarray(files) == path)
        handle = pq.ParquetFile(path.removeprefix("file://"))
        size = handle.metadata.row_group(0).num_rows
        groups = sorted({int(r) // size for r in rows[mine]})
        read = handle.read_row_groups(groups, columns=["id", "x", "y"])
        base = {g: i * size for i, g in enumerate(groups)}
        parts.append(
            read.take(pa.array([base[int(r) // size] + int(r) % size for r in rows[mine]]))
        )
        order.extend(mine.tolist())
    joined = pa.concat_tables(parts)
    return joined.take(pa.array(np.argsort(order)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--files", type=int, default=200)
    parser.add_argument("--rows", type=int, default=5000)
    parser.add_argument("--lookups", type=int, default=20)
    args = parser.parse_args()
    root = make(args.files, args.rows)
    loader = tdu.create_dataloader(
        str(root), batch_size=1024, shuffle=True, num_workers=4, world_size=8, rank=3
    )
    batches = len(loader)
    rng = np.random.default_rng(1)
    ours = hand = 0.0
    for b in rng.integers(0, batches, args.lookups).tolist():
        start = time.perf_counter()
        table = loader.rows_at(int(b), epoch=3)
        ours += time.perf_counter() - start
        start = time.perf_counter()
        again = by_hand(table)
        hand += time.perf_counter() - start
        assert pc.all(pc.equal(again.column("id"), table.column("id"))).as_py()
    print(
        f"{args.files * args.rows:,} rows in {args.files} files; rank 3 of 8, 4 workers, "
        f"{batches:,} batches; {args.lookups} lookups"
    )
    print(f"rows_at        {ours / args.lookups * 1e3:8.1f} ms a batch")
    print(f"by hand        {hand / args.lookups * 1e3:8.1f} ms a batch (the files' row groups)")
    print(f"ratio          {ours / hand:8.2f}x")


if __name__ == "__main__":
    main()
