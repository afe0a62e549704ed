"""Straggler overhead of packed batches, before and after balancing them by compute (issue 45).

Simulated, CPU only, no loader: web-like document lengths, lognormal with ``mu = 6.5``,
``sigma = 1.3`` (median 665 tokens, mean about 1,550, a heavy tail: 1 document in 1,000 is
over 36k tokens), drawn in a random order and packed by concatenation (`Packing("concat")`) into
``seq_len`` sequences, a document cut at every sequence end; a batch is ``batch_size``
sequences. The epoch is one token order cut into equal per-rank streams (docs/adr/0022), so
rank ``r``'s batch at step ``s`` is batch ``r * S + s`` of the order. A batch's cost is over its
fragments (the pieces ``cu_seqlens`` cuts, `planning.balance.batch_costs`):

- ``7B causal``: ``sum L**2 + linear * sum L``, ``linear`` from a Llama-2-7B-like shape (hidden
  4,096, 32 layers, 6.7e9 parameters; causal, a kernel that skips the masked half:
  `linear_coefficient`, about 51,000);
- ``7B full``: the same with PaLM's accounting (every query against every key of its
  document, ``linear = 6 h = 24,576``): attention weighs twice as much (issue 45's numbers);
- ``attn``: ``sum L**2`` alone (the attention part).

The straggler overhead (`straggler_overhead`: sum over steps of the slowest rank's cost over
the sum of the mean rank's, less 1) is printed for the plan order (``before``), each rank
reordering only its own batches inside the window (``own``), and the window's batches handed
out again across ranks (``balanced``, `balance_window`; the least possible for any reordering
of the window's batches, so it is also the "best reordering" the issue compares with);
``moved``: the share of batches ``balanced`` gives to another rank than the one planned (each
must then be read by that rank). The last columns time `balance_window` and `batch_costs` a
window (best of a few runs; ``costs``: the epoch's, scaled to a window).

Usage::

    python benchmarks/balance.py              # 512 steps an epoch, ~1 minute on 2 cores
    python benchmarks/balance.py --steps 256 --ranks 8
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from torch_dataloader_utils.planning.balance import (
    balance_epoch,
    balance_window,
    batch_costs,
    linear_coefficient,
    step_costs,
    straggler_overhead,
)

MU, SIGMA = 6.5, 1.3
LINEAR_7B = linear_coefficient(4096, params=6.7e9, layers=32)
LINEAR_FULL = linear_coefficient(4096, causal=False)  # (PaLM's accounting: 6 h)


def packed_fragments(
    rng: np.random.Generator, seq_len: int, sequences: int
) -> tuple[np.ndarray, np.ndarray]:
    """Concat packing of lognormal documents into ``sequences`` sequences: every fragment's
    length (a document piece inside a sequence) and each sequence's first fragment (+ the end)."""
    total = seq_len * sequences
    mean = float(np.exp(MU + SIGMA**2 / 2))
    ends = np.empty(0, dtype=np.int64)
    while not len(ends) or ends[-1] < total:  # (draw until the documents cover the epoch)
        more = np.maximum(1, rng.lognormal(MU, SIGMA, size=int(total / mean * 1.05) + 16))
        start = ends[-1] if len(ends) else 0
        ends = np.concatenate((ends, start + np.cumsum(more.astype(np.int64))))
    ends = ends[ends < total]
    cuts = np.union1d(ends, np.arange(0, total + 1, seq_len, dtype=np.int64))
    lengths = np.diff(cuts)
    offsets = np.searchsorted(cuts, np.arange(0, total + 1, seq_len), side="left")
    return lengths, offsets


def best_time(fn, repeat: int = 5) -> float:
    """The best of ``repeat`` runs of ``fn``, in seconds."""
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def run(seq_len: int, ranks: int, batch_size: int, steps: int, windows: list[int]) -> list[str]:
    """The table's rows for one packed epoch."""
    rng = np.random.default_rng([seq_len, ranks, batch_size])
    batches = steps * ranks
    lengths, seq_offsets = packed_fragments(rng, seq_len, batches * batch_size)
    offsets = seq_offsets[::batch_size]  # (a batch: batch_size sequences)
    rows = []
    for name, linear in (("7B causal", LINEAR_7B), ("7B full", LINEAR_FULL), ("attn", 0.0)):
        t_costs = best_time(
            lambda linear=linear: batch_costs(lengths, offsets, "attention", linear=linear), 2
        )
        flat = batch_costs(lengths, offsets, "attention", linear=linear)
        costs = flat.reshape(ranks, steps).T  # (rank r's stream: batches r*S .. r*S+S-1)
        before = straggler_overhead(costs)
        for window in windows:
            own = balance_epoch(costs, window=window, seed=0, across_ranks=False)
            moved = balance_epoch(costs, window=window, seed=0)
            part = costs[:window]
            t_balance = best_time(lambda part=part: balance_window(part, seed=0, window=1))
            rows.append(
                f"| {name} | {seq_len // 1024}k | {ranks} | {batch_size} | {window} "
                f"| {100 * before:.1f}% | {100 * straggler_overhead(step_costs(costs, own)):.2f}% "
                f"| {100 * straggler_overhead(step_costs(costs, moved)):.2f}% "
                f"| {100 * float(np.mean(moved % ranks != np.arange(ranks))):.0f}% "
                f"| {1e6 * t_balance:.0f} | {1e6 * t_costs * window / steps:.0f} |"
            )
    return rows


def main() -> None:
    global MU, SIGMA  # (the simulation's options, set once from the command line)
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=512, help="steps an epoch")
    parser.add_argument("--ranks", type=int, nargs="+", default=[8, 64])
    parser.add_argument("--seq-len", type=int, nargs="+", default=[8192, 32768, 131072])
    parser.add_argument("--batch-size", type=int, nargs="+", default=[1, 4])
    parser.add_argument("--windows", type=int, nargs="+", default=[8, 64, 256])
    parser.add_argument("--sigma", type=float, default=SIGMA, help="the lognormal's sigma")
    parser.add_argument("--mean", type=float, help="the documents' mean length (sets mu)")
    args = parser.parse_args()
    SIGMA = args.sigma
    if args.mean:
        MU = float(np.log(args.mean) - SIGMA**2 / 2)
    mean = float(np.exp(MU + SIGMA**2 / 2))
    print(
        f"documents: lognormal(mu={MU:.3f}, sigma={SIGMA}), mean {mean:.0f} tokens; "
        f"linear: 7B causal {LINEAR_7B:.0f}, 7B full {LINEAR_FULL:.0f}; "
        f"{args.steps} steps an epoch"
    )
    print(
        "| cost | seq_len | ranks | batch | window | before | own | balanced "
        "| moved | balance µs/window | costs µs/window |"
    )
    print("|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|")
    t0 = time.perf_counter()
    for batch_size in args.batch_size:
        for ranks in args.ranks:
            for seq_len in args.seq_len:
                for row in run(seq_len, ranks, batch_size, args.steps, args.windows):
                    print(row, flush=True)
    print(f"({time.perf_counter() - t0:.0f} s)")


if __name__ == "__main__":
    main()
