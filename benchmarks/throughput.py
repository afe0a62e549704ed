"""Throughput against the practical limit, measured in the same run.

The limit: raw pyarrow ``ParquetFile.iter_batches`` + zero-copy torch conversion, one process,
no shuffle (with and without pyarrow's threads; the faster is the limit). Ours:
``create_dataloader`` with shuffle on, ``num_workers`` 0 and 2 (persistent). Every configuration
runs in its own subprocess, so its peak RSS is its own, for two epochs: rows/s and MB/s (decoded
Arrow bytes) are the warm second epoch's, time to first batch the cold first epoch's (process
start excluded, planning and worker start included). CPU per row is the warm epoch's process
CPU time (user + system) over its rows: the main process's, and the total with the workers'.

Usage::

    python benchmarks/throughput.py                 # tabular + token datasets
    python benchmarks/throughput.py --rows 500000   # smaller
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import resource
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

HERE = Path(__file__).resolve().parent
DATA = HERE / ".data"


def make_tabular(root: Path, rows: int, files: int = 8) -> Path:
    """8 float32, 2 int64, a 20-char string, a 64-float embedding (docs/benchmarks.md, tabular)."""
    out = root / f"tabular-{rows}"
    if (out / "_done").exists():
        return out
    out.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    per = rows // files
    for f in range(files):
        n = per if f < files - 1 else rows - per * (files - 1)
        ids = np.arange(f * per, f * per + n)
        cols: dict[str, pa.Array] = {"id": pa.array(ids)}
        for j in range(8):
            cols[f"f{j}"] = pa.array(rng.random(n, dtype=np.float32))
        cols["i1"] = pa.array(rng.integers(0, 1000, n))
        cols["s"] = pa.array([f"{i:020d}" for i in ids])
        emb = pa.array(rng.random(n * 64, dtype=np.float32))
        cols["emb"] = pa.FixedSizeListArray.from_arrays(emb, 64)
        pq.write_table(pa.table(cols), out / f"part-{f:03d}.parquet", row_group_size=131_072)
    (out / "_done").touch()
    return out


def make_tokens(
    root: Path, rows: int, files: int = 4, lengths: tuple[int, int] = (32, 992)
) -> Path:
    """Variable-length int32 token lists (``lengths``: shortest and longest, like an LLM's
    documents cut at a context of about 1k) plus an id."""
    low, high = lengths
    out = root / f"tokens-{rows}-{low}-{high}"
    if (out / "_done").exists():
        return out
    out.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(1)
    per = rows // files
    for f in range(files):
        n = per if f < files - 1 else rows - per * (files - 1)
        lengths = rng.integers(low, high + 1, n)
        offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
        values = rng.integers(0, 50_000, int(offsets[-1]), dtype=np.int32)
        table = pa.table(
            {
                "id": pa.array(np.arange(f * per, f * per + n)),
                "tokens": pa.ListArray.from_arrays(pa.array(offsets), pa.array(values)),
            }
        )
        pq.write_table(table, out / f"part-{f:03d}.parquet", row_group_size=65_536)
    (out / "_done").touch()
    return out


def _raw_convert(batch: pa.RecordBatch) -> dict[str, object]:
    import torch

    out: dict[str, object] = {}
    for name, col in zip(batch.schema.names, batch.columns, strict=True):
        t = col.type
        if pa.types.is_fixed_size_list(t):
            out[name] = torch.from_dlpack(col.flatten()).view(-1, t.list_size)
        elif pa.types.is_list(t):
            offsets = col.offsets.to_numpy()
            out[name] = torch.from_dlpack(col.flatten())
            out[name + "_offsets"] = torch.from_numpy(offsets - offsets[0])
        elif pa.types.is_string(t):
            out[name] = col.to_pylist()
        else:
            out[name] = torch.from_dlpack(col)
    return out


def run_one(kind: str, data: Path, batch_size: int, list_format: str) -> dict[str, float]:
    """Run one configuration in this process for two epochs; returns its measurements.

    Throughput is the second (warm) epoch's: the first pays one-off costs (imports, worker
    start, first-touch memory) that ``first_batch_s`` reports instead.
    """
    import torch  # noqa: F401  (imported before timing, as a training script would)

    files = sorted(str(p) for p in data.glob("*.parquet"))
    loader = None
    if kind.startswith("raw"):
        threads = kind == "raw-threads"  # pyarrow's default; one thread is faster here

        def epoch() -> Iterator[int]:
            for path in files:
                reader = pq.ParquetFile(path)
                for batch in reader.iter_batches(batch_size=batch_size, use_threads=threads):
                    _raw_convert(batch)
                    yield batch.num_rows, batch.nbytes

    else:
        import torch_dataloader_utils as tdu

        workers = int(kind.removeprefix("ours-w"))
        loader = tdu.create_dataloader(
            str(data),
            batch_size=batch_size,
            shuffle=True,
            num_workers=workers,
            persistent_workers=workers > 0,
            list_format=list_format,
        )

        def epoch() -> Iterator[int]:
            loader.set_epoch(loader.dataset.epoch + 1)
            for batch in loader:
                yield len(batch["id"]), 0

    import psutil

    me = psutil.Process()

    def cpu() -> tuple[float, float]:
        """CPU seconds so far of this process and of its live children (the workers).

        This process's from ``time.process_time`` (nanoseconds): psutil's count in ticks of
        10 ms, a third of a token epoch's main-process CPU (0.08 µs a row a tick)."""
        own = time.process_time()
        workers = 0.0
        for child in me.children(recursive=True):
            try:
                times = child.cpu_times()
            except psutil.NoSuchProcess:
                continue
            workers += times.user + times.system
        return own, workers

    first = float("nan")
    for number in range(2):
        cpu_start = cpu()
        start = time.perf_counter()
        rows = nbytes = 0
        for n, b in epoch():
            if not rows and number == 0:
                first = time.perf_counter() - start
            rows += n
            nbytes += b
        elapsed = time.perf_counter() - start
        cpu_end = cpu()
    main_cpu = cpu_end[0] - cpu_start[0]
    workers_cpu = cpu_end[1] - cpu_start[1]
    del epoch
    loader = None  # the persistent workers exit and are reaped, so their peak RSS is counted
    gc.collect()
    rss_self = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    rss_children = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
    return {
        "rows": rows,
        "seconds": elapsed,
        "rows_per_s": rows / elapsed,
        "mb_per_s": nbytes / elapsed / 1e6,
        "first_batch_s": first,
        "main_us_per_row": main_cpu / rows * 1e6,
        "total_us_per_row": (main_cpu + workers_cpu) / rows * 1e6,
        "rss_mb": rss_self,
        "worker_rss_mb": rss_children,
    }


def one_command(kind: str, data: Path, batch_size: int, list_format: str) -> list[str]:
    """The command that runs one configuration (`run_one`) in a process of its own."""
    return [
        sys.executable,
        __file__,
        "--one",
        kind,
        "--data",
        str(data),
        "--batch-size",
        str(batch_size),
        "--list-format",
        list_format,
    ]


def _subprocess(kind: str, data: Path, batch_size: int, list_format: str) -> dict[str, float]:
    cmd = one_command(kind, data, batch_size, list_format)
    done = subprocess.run(cmd, check=True, capture_output=True, text=True)
    result: dict[str, float] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=2_000_000)
    parser.add_argument("--token-rows", type=int, default=125_000)
    parser.add_argument("--batch-size", type=int, default=1024)
    parser.add_argument("--repeat", type=int, default=2, help="runs per config; best is kept")
    parser.add_argument("--one", help=argparse.SUPPRESS)
    parser.add_argument("--data", help=argparse.SUPPRESS)
    parser.add_argument("--list-format", default="padded", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        print(json.dumps(run_one(args.one, Path(args.data), args.batch_size, args.list_format)))
        return
    tabular = make_tabular(DATA, args.rows)
    tokens = make_tokens(DATA, args.token_rows)
    cases = [
        ("tabular", tabular, "padded", ["raw-threads", "raw", "ours-w0", "ours-w2"]),
        ("tokens (padded)", tokens, "padded", ["raw-threads", "raw", "ours-w0", "ours-w2"]),
        ("tokens (offsets)", tokens, "offsets", ["ours-w0", "ours-w2"]),
    ]
    print(f"cpus={os.cpu_count()} batch_size={args.batch_size} best of {args.repeat}")
    print("limit = the faster raw pyarrow run (iter_batches + zero-copy torch, one process);")
    print("MB/s = rows/s x decoded Arrow bytes per row of the raw run")
    header = f"{'dataset':18} {'config':11} {'rows/s':>11} {'MB/s':>7} {'1st batch':>10} "
    print(
        header
        + f"{'RSS MB':>7} {'wrk RSS':>8} {'x limit':>8} {'main µs/row':>12} {'total µs/row':>13}"
    )
    limits: dict[Path, float] = {}
    row_bytes: dict[Path, float] = {}
    for label, data, list_format, kinds in cases:
        for kind in kinds:
            runs = [
                _subprocess(kind, data, args.batch_size, list_format) for _ in range(args.repeat)
            ]
            best = max(runs, key=lambda r: r["rows_per_s"])
            if kind.startswith("raw"):
                limits[data] = max(limits.get(data, 0.0), best["rows_per_s"])
                row_bytes[data] = best["mb_per_s"] / best["rows_per_s"]
            ratio = best["rows_per_s"] / limits[data]
            print(
                f"{label:18} {kind:11} {best['rows_per_s']:11,.0f} "
                f"{best['rows_per_s'] * row_bytes[data]:7.0f} "
                f"{best['first_batch_s']:9.3f}s {best['rss_mb']:7.0f} "
                f"{best['worker_rss_mb']:8.0f} {ratio:8.2f} "
                f"{best['main_us_per_row']:12.3f} {best['total_us_per_row']:13.3f}",
                flush=True,
            )


if __name__ == "__main__":
    main()
