"""Wide binary columns across the worker→main hop: packed transport against pickled lists.

The data: Parquet files of ``--rows`` rows, each an ``id`` (int64), a ``--payload``-byte random
``bin`` (binary) value and a short ``label`` (string); batches of 256, no shuffling, 2 workers
(persistent, fork), torch output. Two transports of the same loader, same run:

- ``packed``: the default; string/binary columns travel as Arrow offsets and bytes in the
  worker's packed shared buffer (`transport.pack`), the main process makes the lists;
- ``plain``: a ``collate_fn`` that returns the batch unchanged, which sends the workers' batches
  as plain bundles (the lists are made in the worker and pickled).

Configurations are interleaved, ``--repeat`` epochs each; the best epoch of each is kept (the
machine is shared and noisy). Prints samples/s, MB/s of payload and the main process's CPU
time per sample (where the unpacking happens).

Usage::

    python benchmarks/transport_bytes.py
    python benchmarks/transport_bytes.py --rows 20000 --repeat 3 --payload 16000
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

import torch_dataloader_utils as tdu

HERE = Path(__file__).resolve().parent
DATA = HERE / ".data"
BATCH = 256


def make_data(root: Path, rows: int, payload: int, files: int = 4) -> Path:
    """Write the files once (kept under ``benchmarks/.data``)."""
    out = root / f"bytes-{rows}x{payload}"
    if (out / "_done").exists():
        return out
    out.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    per = -(-rows // files)
    for f in range(files):
        ids = np.arange(f * per, min(rows, (f + 1) * per))
        blob = rng.bytes(payload * len(ids))
        offsets = pa.array(np.arange(len(ids) + 1, dtype=np.int32) * payload)
        table = pa.table(
            {
                "id": pa.array(ids),
                "bin": pa.BinaryArray.from_buffers(
                    pa.binary(), len(ids), [None, offsets.buffers()[1], pa.py_buffer(blob)]
                ),
                "label": pa.array([f"class-{i % 1000}" for i in ids]),
            }
        )
        # Uncompressed: random bytes do not compress, and decompression is not measured here.
        pq.write_table(
            table, out / f"part-{f:03d}.parquet", row_group_size=8192, compression="none"
        )
    (out / "_done").touch()
    return out


def unchanged(batch: Any) -> Any:
    """A collate_fn: any collate_fn sends batches as pickled plain bundles."""
    return batch


def loader(data: Path, collate: bool) -> Iterable[Any]:
    return tdu.create_dataloader(
        str(data),
        batch_size=BATCH,
        shuffle=False,
        num_workers=2,
        persistent_workers=True,
        multiprocessing_context="fork",
        collate_fn=unchanged if collate else None,
    )


def epoch(batches: Iterable[Any]) -> tuple[int, float, float]:
    """Samples, seconds and main-process CPU seconds of one epoch."""
    started, cpu = time.perf_counter(), time.process_time()
    n = 0
    for batch in batches:
        assert isinstance(batch["bin"][0], bytes) and isinstance(batch["label"][0], str)
        n += len(batch["id"])
    return n, time.perf_counter() - started, time.process_time() - cpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=40_000)
    parser.add_argument("--payload", type=int, default=4000, help="bytes per bin value")
    parser.add_argument("--repeat", type=int, default=5, help="timed epochs per configuration")
    parser.add_argument("--data", type=Path, default=DATA)
    args = parser.parse_args()

    data = make_data(args.data, args.rows, args.payload)
    print(
        f"{args.rows} rows x ({args.payload} B bin + id + label); batches of {BATCH}; "
        f"2 workers (fork, persistent); best of {args.repeat}"
    )
    loaders = {"packed": loader(data, False), "plain (pickled lists)": loader(data, True)}
    best: dict[str, tuple[float, float]] = {}
    for name, batches in loaders.items():  # warm-up epoch: workers, page cache
        n, _, _ = epoch(batches)
        if n != args.rows:
            raise SystemExit(f"{name}: {n} samples in an epoch, expected {args.rows}")
    for _ in range(args.repeat):
        for name, batches in loaders.items():  # interleaved
            n, seconds, cpu = epoch(batches)
            rate, main_us = n / seconds, 1e6 * cpu / n
            if rate > best.get(name, (0.0, 0.0))[0]:
                best[name] = (rate, main_us)
    for name, (rate, main_us) in best.items():
        print(
            f"{name:>22}: {rate:>9,.0f} samples/s  {rate * args.payload / 1e6:>6,.0f} MB/s  "
            f"main process {main_us:.1f} µs CPU/sample"
        )
    ratio = best["packed"][0] / best["plain (pickled lists)"][0]
    print(f"packed / plain: {ratio:.2f}x")


if __name__ == "__main__":
    main()
