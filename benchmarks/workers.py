"""``num_workers="auto"``'s pick against the best of 0, 1 and 2 workers, in the same run.

The demo data (`tdu demo`'s generator), shuffled, batches of 1,024. Each count is one loader
with persistent workers, read once to start them; then whole epochs in interleaved rounds, the
best of each count kept. Prints the pick, the reason it logged, each count's rows/s and the
pick's ratio to the best (the goal is >= 0.9; docs/adr/0033-where-the-time-goes.md).

A benchmark and not a test: beside another test process on a 2-core machine, a count's speed
says more about its neighbour than about the pick.

Usage::

    python benchmarks/workers.py                 # 300k rows, 3 rounds
    python benchmarks/workers.py --rows 1000000 --rounds 5
"""

from __future__ import annotations

import argparse
import logging
import tempfile
import time
from collections import Counter
from pathlib import Path

import torch_dataloader_utils as tdu
from torch_dataloader_utils.cli import make_demo_dataset


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=300_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--batch-size", type=int, default=1024)
    args = parser.parse_args()

    reasons: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            reasons.append(record.getMessage())

    logger = logging.getLogger("torch_dataloader_utils")
    logger.addHandler(Keep(logging.INFO))
    logger.setLevel(logging.INFO)
    with tempfile.TemporaryDirectory() as tmp:
        root = str(make_demo_dataset(Path(tmp), args.rows))
        picked = tdu.create_dataloader(root, batch_size=args.batch_size, num_workers="auto")
        count = int(picked.num_workers)
        loaders = {
            w: tdu.create_dataloader(
                root,
                batch_size=args.batch_size,
                shuffle=True,
                num_workers=w,
                persistent_workers=w > 0,
            )
            for w in sorted({0, 1, 2, count})
        }
        for loader in loaders.values():  # (workers started; every row once)
            assert Counter(i for b in loader for i in b["id"].tolist()) == Counter(range(args.rows))
        best = dict.fromkeys(loaders, 0.0)
        for epoch in range(1, args.rounds + 1):
            for w, loader in loaders.items():
                loader.set_epoch(epoch)
                start = time.perf_counter()
                rows = sum(len(b["id"]) for b in loader)
                best[w] = max(best[w], rows / (time.perf_counter() - start))
    print(f"auto picked {count}: {next((r for r in reasons if 'auto' in r), '(not logged)')}")
    print("| workers | rows/s (best) | x best |")
    print("|--:|--:|--:|")
    top = max(best.values())
    for w, rate in best.items():
        mark = " (auto)" if w == count else ""
        print(f"| {w}{mark} | {rate:,.0f} | {rate / top:.2f} |")
    print(f"auto / best: {best[count] / top:.2f} (goal >= 0.90)")


if __name__ == "__main__":
    main()
