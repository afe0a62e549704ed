"""ORC and Arrow IPC throughput: ours against raw pyarrow on the same files, in the same run.

Raw pyarrow: ``ORCFile.read_stripe`` over every stripe, ``RecordBatchFileReader.get_batch``
over every batch (IPC stream: ``open_stream``), cut into ``--batch-size`` rows, numeric
columns to torch zero-copy, one process. Ours: ``create_dataloader`` with shuffle on,
``num_workers`` 0 and 2, the second (warm) epoch timed. Prints rows/s and ours / raw.

Usage::

    python benchmarks/formats_orc_ipc.py                # 400k rows
    python benchmarks/formats_orc_ipc.py --rows 2000000
"""

from __future__ import annotations

import argparse
import tempfile
import time
import warnings
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.ipc as ipc
import pyarrow.orc as orc
import torch

import torch_dataloader_utils as tdu

FILES = 4


def make(root: Path, rows: int) -> dict[str, Path]:
    """8 float32 columns and an int64 id, as ORC, an IPC file and an IPC stream."""
    rng = np.random.default_rng(0)
    per = rows // FILES
    out = {kind: root / kind for kind in ("orc", "ipc-file", "ipc-stream")}
    for path in out.values():
        path.mkdir()
    for f in range(FILES):
        cols = {"id": pa.array(np.arange(f * per, (f + 1) * per))}
        cols |= {f"f{j}": pa.array(rng.random(per, dtype=np.float32)) for j in range(8)}
        table = pa.table(cols)
        orc.write_table(table, out["orc"] / f"p{f}.orc", stripe_size=8 << 20)
        for kind, new in (("ipc-file", ipc.new_file), ("ipc-stream", ipc.new_stream)):
            with new(str(out[kind] / f"p{f}.arrow"), table.schema) as writer:
                writer.write_table(table, max_chunksize=65_536)
    return out


def to_torch(batch: pa.RecordBatch) -> dict[str, torch.Tensor]:
    columns = zip(batch.schema.names, batch.columns, strict=True)
    return {n: torch.from_numpy(c.to_numpy()) for n, c in columns}


def raw(kind: str, root: Path, batch_size: int) -> float:
    """Rows/s of raw pyarrow reading every file once, in ``batch_size``-row slices."""
    rows, began = 0, time.perf_counter()
    for path in sorted(root.iterdir()):
        if kind == "orc":
            handle = orc.ORCFile(str(path))
            batches = (handle.read_stripe(i) for i in range(handle.nstripes))
        elif kind == "ipc-file":
            reader = ipc.open_file(pa.memory_map(str(path)))
            batches = (reader.get_batch(i) for i in range(reader.num_record_batches))
        else:
            batches = iter(ipc.open_stream(pa.memory_map(str(path))))
        for batch in batches:
            for at in range(0, batch.num_rows, batch_size):
                to_torch(batch.slice(at, batch_size))
            rows += batch.num_rows
    return rows / (time.perf_counter() - began)


def ours(kind: str, root: Path, workers: int, batch_size: int) -> float:
    """Rows/s of the second epoch of a shuffled loader."""
    loader = tdu.create_dataloader(
        root,
        format="orc" if kind == "orc" else "ipc",
        batch_size=batch_size,
        shuffle=True,
        num_workers=workers,
        persistent_workers=workers > 0,
        multiprocessing_context="fork" if workers else None,
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
    parser.add_argument("--rows", type=int, default=400_000)
    parser.add_argument("--batch-size", type=int, default=1024)
    args = parser.parse_args()
    warnings.filterwarnings("ignore", message=".*not writable.*")  # zero-copy, read-only views
    with tempfile.TemporaryDirectory() as tmp:
        sources = make(Path(tmp), args.rows)
        print(f"{'source':12} {'raw rows/s':>12} {'ours w=0':>12} {'ours w=2':>12}  ratios")
        for kind, root in sources.items():
            limit = max(raw(kind, root, args.batch_size) for _ in range(2))
            zero = ours(kind, root, 0, args.batch_size)
            two = ours(kind, root, 2, args.batch_size)
            print(
                f"{kind:12} {limit:12,.0f} {zero:12,.0f} {two:12,.0f}  "
                f"{zero / limit:.2f} / {two / limit:.2f}"
            )


if __name__ == "__main__":
    main()
