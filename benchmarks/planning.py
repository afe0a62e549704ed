"""Planning time for many files: listing plus one footer read per file, in parallel threads.

Compared in the same run with the floor: ``pyarrow.parquet.read_metadata`` of every file in one
thread, and pyarrow's own ``pyarrow.dataset.dataset(...).get_fragments()`` with metadata.

Usage::

    python benchmarks/planning.py --files 10000
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.parquet as pq

HERE = Path(__file__).resolve().parent


def make_files(root: Path, files: int) -> Path:
    """``files`` small Parquet files of 100 rows and 3 columns."""
    out = root / f"many-{files}"
    if (out / "_done").exists():
        return out
    out.mkdir(parents=True, exist_ok=True)
    table = pa.table({"id": np.arange(100), "x": np.ones(100, np.float32), "s": ["a"] * 100})
    for i in range(files):
        pq.write_table(table, out / f"part-{i:05d}.parquet")
    (out / "_done").touch()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--files", type=int, default=10_000)
    args = parser.parse_args()
    root = make_files(HERE / ".data", args.files)

    start = time.perf_counter()
    for path in sorted(root.glob("*.parquet")):
        pq.read_metadata(path)
    serial = time.perf_counter() - start

    start = time.perf_counter()
    dataset = ds.dataset(root, format="parquet")
    for fragment in dataset.get_fragments():
        fragment.ensure_complete_metadata()
    arrow = time.perf_counter() - start

    import torch_dataloader_utils as tdu

    start = time.perf_counter()
    ours = tdu.StructuredDataset(str(root), shuffle=True)
    planned = time.perf_counter() - start
    assert ours.plan.num_rows == 100 * args.files

    print(f"{args.files} files, {len(ours.plan.chunks)} chunks")
    print(f"read_metadata, one thread:        {serial:6.2f} s")
    print(f"pyarrow.dataset fragments:        {arrow:6.2f} s")
    print(f"StructuredDataset (list + plan):  {planned:6.2f} s  ({planned / serial:.2f}x serial)")


if __name__ == "__main__":
    main()
