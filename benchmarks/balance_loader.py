"""Balance by compute through the real loader (issue 45): straggler overhead of the batches the
ranks really get, and what balancing costs in loader throughput and memory.

Data: Parquet token lists of lognormal documents (``mu = 6.5``, ``sigma = 1.3``, as
`benchmarks/balance.py` simulates; at most 4 x ``seq_len`` tokens), row groups of 1,024
documents, written once under ``--dir``. Every rank of ``--ranks`` is a loader of its own in
this process (``rank=``, ``world_size=``), reading one whole epoch of packed batches by
concatenation, ``Packing(seq_len, balance=None)`` against
``Balance(window, cost="attention", linear=...)`` (a 7B causal shape,
`linear_coefficient`). A batch's cost is computed from its ``cu_seqlens`` (padding left out);
the straggler overhead is the sum over steps of the slowest rank's cost over the mean
rank's, less 1.

Then rank 0's epochs alone are timed, plain and balanced, in-process and with 2 forked
persistent workers, each in a fresh spawned process (best of ``--rounds`` interleaved rounds):
tokens/s and the peak RSS (``VmHWM``) of the process and its workers, summed. A balanced rank reads
the batches it takes from the other ranks' streams, so it decodes their blocks too.

``--figure PATH`` writes an SVG of the slowest and the mean rank's cost at each step, before
and after (docs/concepts/packing.md shows it).

Usage::

    python benchmarks/balance_loader.py                 # 8k context, 8 ranks, ~2 minutes
    python benchmarks/balance_loader.py --figure docs/concepts/balance.svg
"""

from __future__ import annotations

import argparse
import multiprocessing
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

import torch_dataloader_utils as tdu
from torch_dataloader_utils.planning.balance import linear_coefficient, straggler_overhead

MU, SIGMA = 6.5, 1.3
LINEAR_7B = linear_coefficient(4096, params=6.7e9, layers=32)
PAD = -1
WINDOW_SHOWN = 64  # (the figure's label; set from --window)


def write(root: Path, tokens: int, seq_len: int, seed: int = 0) -> int:
    """Lognormal documents of about ``tokens`` tokens in all under ``root``; returns the count."""
    if (root / "_done").exists():
        return int((root / "_done").read_text())
    root.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    lengths: list[int] = []
    total = 0
    while total < tokens:
        n = int(min(max(1, rng.lognormal(MU, SIGMA)), 4 * seq_len))
        lengths.append(n)
        total += n
    per_file = 1024 * 8
    for f, start in enumerate(range(0, len(lengths), per_file)):
        part = np.asarray(lengths[start : start + per_file], np.int64)
        offsets = np.zeros(len(part) + 1, np.int32)
        np.cumsum(part, out=offsets[1:])
        values = rng.integers(0, 32000, int(offsets[-1]), dtype=np.int32)
        lists = pa.ListArray.from_arrays(pa.array(offsets), pa.array(values))
        pq.write_table(pa.table({"tokens": lists}), root / f"part-{f:03d}.parquet", 1024)
    (root / "_done").write_text(str(total))
    return total


def loader(root: Path, rank: int, ranks: int, seq_len: int, window: int | None, **kw: Any) -> Any:
    balance = None if window is None else tdu.Balance(window=window, linear=LINEAR_7B)
    return tdu.create_dataloader(
        str(root),
        format="parquet",
        packing=tdu.Packing("tokens", seq_len, pad_value=PAD, balance=balance),
        batch_size=1,
        shuffle=True,
        rank=rank,
        world_size=ranks,
        **kw,
    )


def cost(batch: dict[str, Any]) -> float:
    ids = batch["input_ids"].numpy().reshape(-1)
    cu = batch["cu_seqlens"].numpy().astype(np.int64)
    lengths = np.diff(cu)[ids[cu[:-1]] != PAD].astype(np.float64)
    return float((lengths**2).sum() + LINEAR_7B * lengths.sum())


def step_costs(root: Path, ranks: int, seq_len: int, window: int | None) -> np.ndarray:
    """Each rank's batch cost at each step of epoch 0: shape (steps, ranks)."""
    out = []
    for rank in range(ranks):
        out.append([cost(b) for b in loader(root, rank, ranks, seq_len, window, num_workers=0)])
    return np.asarray(out).T


def timed(root: str, ranks: int, seq_len: int, window: int | None, workers: int) -> tuple:
    """(tokens/s, peak RSS MiB) of rank 0's epochs 1 and 2, after an untimed epoch 0 started
    the (persistent) workers; the peak is this process's plus its workers' (run in a fresh
    process)."""
    import psutil

    kw: dict[str, Any] = {"num_workers": workers}
    if workers:
        kw.update(persistent_workers=True, multiprocessing_context="fork")
    ld = loader(Path(root), 0, ranks, seq_len, window, **kw)
    for _ in ld:
        pass
    start, tokens = time.perf_counter(), 0
    for epoch in (1, 2):
        ld.set_epoch(epoch)
        for batch in ld:
            tokens += int((batch["input_ids"] != PAD).sum())
    seconds = time.perf_counter() - start
    peak = 0
    for process in (psutil.Process(), *psutil.Process().children(recursive=True)):
        with open(f"/proc/{process.pid}/status") as status:
            hwm = next(line for line in status if line.startswith("VmHWM:"))
        peak += int(hwm.split()[1])
    return tokens / seconds, peak / 1024


def _child(conn: Any, args: tuple) -> None:
    conn.send(timed(*args))
    conn.close()


def fresh(context: Any, args: tuple) -> tuple:
    """`timed` in a fresh (spawned, not daemonic: it starts workers) process."""
    mine, theirs = context.Pipe()
    process = context.Process(target=_child, args=(theirs, args))
    process.start()
    out = mine.recv()
    process.join()
    return out


def figure(path: Path, before: np.ndarray, after: np.ndarray, title: str) -> None:
    """An SVG of the slowest and the mean rank's cost at each step, before and after, over
    the epoch's mean step cost (the last, short step left out)."""
    width, height, pad, lo, hi = 760, 440, 60, 0.8, 1.2
    scale = float(before[:-1].mean())
    series = [
        (before[:-1].max(axis=1) / scale, "#d62728", "slowest rank, plan order"),
        (before[:-1].mean(axis=1) / scale, "#ff9896", "mean rank, plan order"),
        (after[:-1].max(axis=1) / scale, "#1f77b4", "slowest rank, balanced"),
        (after[:-1].mean(axis=1) / scale, "#9ecae1", "mean rank, balanced"),
    ]
    steps = len(before) - 1
    panel = (height - 2 * pad) / 2

    def y(value: float, row: int) -> float:
        bottom = pad + panel * (row + 1) - 16
        return bottom - (panel - 40) * (min(max(value, lo), hi) - lo) / (hi - lo)

    def points(values: np.ndarray, row: int) -> str:
        return " ".join(
            f"{pad + (width - 2 * pad) * i / max(steps - 1, 1):.1f},{y(float(v), row):.1f}"
            for i, v in enumerate(values)
        )

    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}" font-family="sans-serif" font-size="12">',
        f'<rect width="{width}" height="{height}" fill="white"/>',
        f'<text x="{pad}" y="24" font-size="14">{title}</text>',
    ]
    for row, (label, pair, costs) in enumerate(
        (
            ("plan order", series[:2], before),
            (f"balanced, Balance(window={WINDOW_SHOWN})", series[2:], after),
        )
    ):
        for tick in (0.8, 0.9, 1.0, 1.1, 1.2):
            parts.append(
                f'<line x1="{pad}" y1="{y(tick, row):.1f}" x2="{width - pad}" '
                f'y2="{y(tick, row):.1f}" stroke="#ddd"/>'
                f'<text x="{pad - 6}" y="{y(tick, row) + 4:.1f}" text-anchor="end" '
                f'font-size="10">{tick:.1f}</text>'
            )
        parts.append(
            f'<text x="{pad}" y="{y(hi, row) - 8:.1f}">{label}: '
            f"{100 * straggler_overhead(costs):.2f}% straggler overhead</text>"
        )
        for values, colour, _ in pair:
            parts.append(
                f'<polyline fill="none" stroke="{colour}" stroke-width="1.2" '
                f'points="{points(values, row)}"/>'
            )
    for i, (_, colour, name) in enumerate(series):
        x = pad + 170 * i
        parts.append(
            f'<rect x="{x}" y="{height - 22}" width="12" height="4" fill="{colour}"/>'
            f'<text x="{x + 16}" y="{height - 16}" font-size="11">{name}</text>'
        )
    parts.append(
        f'<text x="{width - pad}" y="{height - 36}" text-anchor="end" font-size="11">'
        f"step 1 to {steps}; a step's cost over the epoch's mean (sum L^2 + linear x "
        "tokens)</text></svg>"
    )
    path.write_text("\n".join(parts) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dir", type=Path, default=Path("/tmp/tdu-balance-data"))
    parser.add_argument("--seq-len", type=int, default=8192)
    parser.add_argument("--ranks", type=int, default=8)
    parser.add_argument("--window", type=int, default=64)
    parser.add_argument("--steps", type=int, default=256, help="steps an epoch, about")
    parser.add_argument("--rounds", type=int, default=3, help="timed rounds (0: none)")
    parser.add_argument("--figure", type=Path)
    args = parser.parse_args()
    global WINDOW_SHOWN
    WINDOW_SHOWN = args.window
    root = args.dir / f"{args.seq_len}-{args.ranks}-{args.steps}"
    total = write(root, args.seq_len * args.ranks * args.steps, args.seq_len)
    print(f"{total:,} tokens, {args.ranks} ranks, seq_len {args.seq_len}, batch 1, 7B causal")
    before = step_costs(root, args.ranks, args.seq_len, None)
    after = step_costs(root, args.ranks, args.seq_len, args.window)
    assert before.shape == after.shape
    assert np.isclose(np.sort(before.ravel()), np.sort(after.ravel())).all()  # the same batches
    print(
        f"straggler overhead over {len(before)} steps: plan order "
        f"{100 * straggler_overhead(before):.2f}%, balanced (window {args.window}) "
        f"{100 * straggler_overhead(after):.2f}%"
    )
    if args.figure:
        title = (
            f"Per-step cost, {args.ranks} ranks, {args.seq_len // 1024}k context, 7B causal "
            "(a real epoch of the loader)"
        )
        figure(args.figure, before, after, title)
        print(f"wrote {args.figure}")
    if not args.rounds:
        return
    context = multiprocessing.get_context("spawn")
    best: dict[tuple[int, str], tuple[float, float]] = {}
    for _ in range(args.rounds):
        for workers in (0, 2):
            for name, window in (("plain", None), ("balanced", args.window)):
                rate, peak = fresh(context, (str(root), args.ranks, args.seq_len, window, workers))
                key = (workers, name)
                old = best.get(key, (0.0, float("inf")))
                best[key] = (max(old[0], rate), min(old[1], peak))
    print("| workers | plain tokens/s | balanced tokens/s | ratio | plain peak MiB | balanced |")
    print("|--:|--:|--:|--:|--:|--:|")
    for workers in (0, 2):
        plain, balanced = best[(workers, "plain")], best[(workers, "balanced")]
        print(
            f"| {workers} | {plain[0] / 1e6:.1f}M | {balanced[0] / 1e6:.1f}M "
            f"| {balanced[0] / plain[0]:.2f} | {plain[1]:.0f} | {balanced[1]:.0f} |"
        )
    sys.stdout.flush()


if __name__ == "__main__":
    main()
