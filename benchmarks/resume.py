"""Resume cost: state size, and time to the first batch after a resume against a fresh start.

For each configuration (shuffle on; ``num_workers`` 0 and 2; a position in the middle of the
epoch and near its end) it measures, in the same run:

- the state's size (``pickle`` and JSON bytes);
- time to first batch of a fresh loader (planning and worker start included);
- time to first batch of a fresh loader that loaded the state (a seek: one block re-read);
- time to the same batch by replay (iterating the skipped batches), the cost a replaying
  loader would pay;
- that the resumed batches equal the uninterrupted run's (ids compared).

Usage::

    python benchmarks/resume.py                 # 2M-row tabular dataset (throughput.py's)
    python benchmarks/resume.py --rows 500000
"""

from __future__ import annotations

import argparse
import json
import pickle
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import torch_dataloader_utils as tdu
from throughput import DATA, make_tabular


def build(data: Path, workers: int, batch_size: int) -> tdu.TabularDataLoader:
    options = {"persistent_workers": True} if workers else {}
    return tdu.create_dataloader(
        data, batch_size=batch_size, shuffle=True, num_workers=workers, **options
    )


def first_batch(loader: tdu.TabularDataLoader) -> tuple[float, torch.Tensor]:
    start = time.perf_counter()
    batch = next(iter(loader))
    return time.perf_counter() - start, batch["id"]


def measure(data: Path, workers: int, batch_size: int, fraction: float) -> dict[str, object]:
    reference = build(data, workers, batch_size)
    reference.set_epoch(1)
    total = len(reference)
    k = int(total * fraction)
    it = iter(reference)
    start = time.perf_counter()
    for _ in range(k):
        next(it)
    replay = time.perf_counter() - start  # the k batches a replaying loader would re-read
    expected = next(it)["id"]
    state = reference.state_dict()  # after k + 1 batches
    following = next(it)["id"]
    del it

    start = time.perf_counter()
    fresh = build(data, workers, batch_size)
    fresh.set_epoch(1)
    fresh_ttfb, _ = first_batch(fresh)
    fresh_total = time.perf_counter() - start

    start = time.perf_counter()
    resumed = build(data, workers, batch_size)
    resumed.load_state_dict(state)
    resume_ttfb, got = first_batch(resumed)
    resume_total = time.perf_counter() - start
    assert torch.equal(got, following), "the resumed batch differs from the uninterrupted one"
    assert not torch.equal(got, expected)
    return {
        "workers": workers,
        "position": f"{k + 1}/{total}",
        "state_pickle_b": len(pickle.dumps(state)),
        "state_json_b": len(json.dumps(state)),
        "fresh_ttfb_s": fresh_ttfb,
        "fresh_build_and_ttfb_s": fresh_total,
        "resume_ttfb_s": resume_ttfb,
        "resume_build_and_ttfb_s": resume_total,
        "replay_s": replay,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=2_000_000)
    parser.add_argument("--batch-size", type=int, default=1024)
    args = parser.parse_args()
    data = make_tabular(DATA, args.rows)
    print(f"dataset: {data} ({args.rows:,} rows), batch {args.batch_size}, shuffle on")
    print(
        "| workers | resumed at batch | state (pickle / JSON bytes) | fresh: first batch "
        "(build + first) | resumed: first batch (build + first) | replay instead |"
    )
    print("|--:|--:|--:|--:|--:|--:|")
    for workers in (0, 2):
        for fraction in (0.5, 0.95):
            r = measure(data, workers, args.batch_size, fraction)
            print(
                f"| {r['workers']} | {r['position']} | {r['state_pickle_b']} / "
                f"{r['state_json_b']} | {r['fresh_ttfb_s']:.3f} s "
                f"({r['fresh_build_and_ttfb_s']:.3f} s) | {r['resume_ttfb_s']:.3f} s "
                f"({r['resume_build_and_ttfb_s']:.3f} s) | {r['replay_s']:.2f} s |"
            )


if __name__ == "__main__":
    main()
