"""``tdu profile PATH``: the loader run on the data for a bounded time per configuration
(``--workers 0,2,4``), a plain-text summary on the terminal and an HTML report with pictures
(`metrics.page`), ending with the ``num_workers`` and ``prefetch_factor`` it recommends and why
(docs/how-to/profile.md)."""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

import numpy as np

from ..metrics.clock import STAGES
from ..metrics.page import Run, write_page
from ..metrics.workers import cores_per_rank

__all__ = ["add_profile", "profile", "recommend", "run_one"]

# Configurations within this share of the fastest count as as fast (fewer workers, or a
# shallower queue, preferred: less memory).
_AS_FAST = 0.05


def add_profile(command: argparse.ArgumentParser) -> None:
    """The options of ``tdu profile``."""
    command.add_argument("path", help="a path, URL, directory or glob")
    command.add_argument("--format", default="parquet", help="the format's name")
    command.add_argument("--batch-size", type=int, default=1024, help="rows per batch")
    command.add_argument("--columns", default=None, help="comma-separated (default: all)")
    command.add_argument(
        "--workers", default="0,2", help="worker counts to run, comma-separated, e.g. 0,2,4"
    )
    command.add_argument("--seconds", type=float, default=5.0, help="run time of each one")
    command.add_argument(
        "--prefetch", type=int, default=2, help="prefetch_factor of workers (4 is tried too)"
    )
    command.add_argument("--no-shuffle", action="store_true", help="read in plan order")
    command.add_argument(
        "--storage-options", default=None, help="JSON, e.g. '{\"anon\": true}' (default: none)"
    )
    command.add_argument("--out", default="tdu-profile.html", help="the HTML report")


def run_one(args: argparse.Namespace, workers: int, prefetch: int | None = None) -> Run:
    """The loader with ``workers`` run for ``args.seconds`` (epochs in turn): its batches'
    waits and rows, and the seconds each stage took."""
    from .. import create_dataloader

    options: dict[str, Any] = {}
    prefetch = prefetch or args.prefetch
    if workers:
        options.update(prefetch_factor=prefetch, persistent_workers=True)
    if args.columns:
        options["columns"] = [c for c in args.columns.split(",") if c]
    if args.storage_options:
        options["storage_options"] = json.loads(args.storage_options)
    start = time.perf_counter()
    loader = create_dataloader(
        args.path,
        format=args.format,
        batch_size=args.batch_size,
        shuffle=not args.no_shuffle,
        num_workers=workers,
        **options,
    )
    made = time.perf_counter() - start
    waits: list[float] = []
    at: list[float] = []
    rows: list[int] = []
    stages = {s: 0.0 for s in STAGES}
    per_process: dict[str, float] = {}
    first = None
    epoch = 0
    reading = time.perf_counter()
    while time.perf_counter() - reading < args.seconds:
        loader.set_epoch(epoch)
        offset = time.perf_counter() - reading
        for batch in loader:
            if first is None:
                first = time.perf_counter() - start
            rows.append(_rows(batch))
            if time.perf_counter() - reading >= args.seconds:
                break
        pass_ = loader._metrics.waits
        if pass_ is not None:
            waits.extend(pass_.each)
            at.extend(offset + t for t in pass_.at)
        metrics = loader.metrics()
        for stage in STAGES:
            stages[stage] += metrics[f"{stage}_s"]
        for key, value in metrics.items():
            if key.endswith(("_read_s", "_make_s", "_batches")):
                per_process[key] = per_process.get(key, 0.0) + value
        epoch += 1
        if not rows:
            break
    elapsed = time.perf_counter() - reading
    return Run(
        workers=workers,
        prefetch=prefetch if workers else 0,
        rows=int(sum(rows)),
        seconds=elapsed,
        first_batch_s=first or 0.0,
        planning_s=made,
        waits=np.asarray(waits[: len(rows)], np.float64),
        at=np.asarray(at[: len(rows)], np.float64),
        batch_rows=np.asarray(rows, np.int64),
        stages=stages,
        per_process=per_process,
    )


def _rows(batch: Any) -> int:
    """Rows of a batch (a dict of columns: its first column's length)."""
    if isinstance(batch, dict) and batch:
        first = next(iter(batch.values()))
        return len(first) if hasattr(first, "__len__") else 1
    return len(batch) if hasattr(batch, "__len__") else 1


def recommend(runs: list[Run]) -> tuple[int, int, str]:
    """The ``num_workers`` and ``prefetch_factor`` to use, and why."""
    plain = [r for r in runs if r.prefetch <= 2]  # (a deeper queue is judged apart)
    best = max(plain, key=lambda r: r.rows_per_s)
    close = [r for r in plain if r.rows_per_s >= (1 - _AS_FAST) * best.rows_per_s]
    chosen = min(close, key=lambda r: r.workers)
    cores, local = cores_per_rank()
    why = [
        f"num_workers={chosen.workers}: {chosen.rows_per_s:,.0f} rows/s, "
        + (
            "the fastest"
            if chosen is best
            else f"within {100 * _AS_FAST:.0f}% of the fastest ({best.workers} workers, "
            f"{best.rows_per_s:,.0f} rows/s) with fewer workers (less memory)"
        )
        + f"; this machine gives each of {local} rank(s) {max(1, cores // local)} core(s)."
    ]
    prefetch = 2
    deeper = [r for r in runs if r.workers == chosen.workers and r.prefetch > 2]
    if deeper:
        faster = deeper[0].rows_per_s / max(chosen.rows_per_s, 1e-9) - 1
        if faster > _AS_FAST:
            prefetch = deeper[0].prefetch
        why.append(
            f"prefetch_factor={prefetch}: {deeper[0].prefetch} read {100 * faster:+.0f}% "
            "against 2"
            + (" (a deeper queue pays)." if prefetch > 2 else " (no faster: more memory only).")
        )
    return chosen.workers, prefetch, " ".join(why)


def summary(runs: list[Run], advice: tuple[int, int, str]) -> str:
    """The plain-text summary printed on the terminal."""
    lines = [
        f"{'workers':>7} {'rows/s':>12} {'first batch':>12} {'waiting':>8}  "
        "per batch: " + ", ".join(STAGES) + " (ms)"
    ]
    for r in runs:
        per = ", ".join(f"{1e3 * r.stage_per_batch(s):.2f}" for s in STAGES)
        lines.append(
            f"{r.label:>7} {r.rows_per_s:>12,.0f} {r.first_batch_s:>11.3f}s "
            f"{100 * r.wait_share:>7.1f}%  {per}"
        )
    workers, prefetch, why = advice
    lines.append(f"recommended: num_workers={workers}, prefetch_factor={prefetch}. {why}")
    return "\n".join(lines)


def profile(args: argparse.Namespace) -> int:
    """Run ``tdu profile``; returns the exit status."""
    counts = [int(x) for x in str(args.workers).split(",") if x.strip()]
    runs = []
    for workers in counts:
        print(f"profiling num_workers={workers} for {args.seconds:g} s ...", flush=True)
        runs.append(run_one(args, workers))
    best = recommend(runs)[0]
    if best:  # (the queue's depth, measured where it matters: the workers chosen)
        print(f"profiling num_workers={best}, prefetch_factor=4 ...", flush=True)
        runs.append(run_one(args, best, prefetch=4))
    advice = recommend(runs)
    print(summary(runs, advice))
    out = Path(args.out)
    write_page(out, runs, advice, title=f"tdu profile {args.path}")
    print(f"report: {out.resolve()}")
    return 0
