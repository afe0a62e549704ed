"""Packed sequences against the padded read of the same documents and against the limit.

The limit: pyarrow reads the token-list column, numpy concatenates the values and cuts them into
``[batch, seq_len]`` sequences (no shuffle, no boundaries): what packing must at least do. Ours:
``create_dataloader(packing=Packing(...), shuffle=True)`` and the padded one-row-per-document
read of the same column (``batch_size`` rows holding about as many tokens as a packed batch),
``num_workers`` 0 and 2. Tokens/s counts real tokens (padding excluded); each configuration is
run ``--repeat`` times in this process (the second epoch timed), the best kept.

Usage::

    python benchmarks/packing.py                  # 20,000 documents of 32-992 tokens
    python benchmarks/packing.py --documents 5000
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import torch

import torch_dataloader_utils as tdu

HERE = Path(__file__).resolve().parent
DATA = HERE / ".data"


def make(documents: int) -> tuple[Path, int]:
    """Documents of 32-992 tokens (LLM-like lengths), token ids below 50,000."""
    root = DATA / f"packing-{documents}"
    rng = np.random.default_rng(0)
    lengths = rng.integers(32, 993, documents)
    if not (root / "_done").exists():
        root.mkdir(parents=True, exist_ok=True)
        offsets = np.r_[0, np.cumsum(lengths)]
        values = rng.integers(0, 50_000, int(offsets[-1])).astype(np.int32)
        for part, rows in enumerate(np.array_split(np.arange(documents), 8)):
            lo, hi = int(offsets[rows[0]]), int(offsets[rows[-1] + 1])
            column = pa.ListArray.from_arrays(
                pa.array(offsets[rows[0] : rows[-1] + 2] - lo, pa.int32()), pa.array(values[lo:hi])
            )
            pq.write_table(pa.table({"tokens": column}), root / f"part-{part}.parquet")
        (root / "_done").touch()
    return root, int(lengths.sum())


def limit(root: Path, seq_len: int, batch: int) -> int:
    """Tokens of the concatenate-and-split read (the limit)."""
    tokens = 0
    for path in sorted(root.glob("*.parquet")):
        column = pq.read_table(path, columns=["tokens"]).column("tokens").combine_chunks()
        values = column.flatten().to_numpy()
        whole = len(values) // (seq_len * batch) * seq_len * batch
        for sequences in np.split(values[:whole], max(1, whole // (seq_len * batch))):
            tokens += torch.from_numpy(sequences.reshape(batch, seq_len)).numel()
    return tokens


def packed(root: Path, seq_len: int, batch: int, workers: int) -> int:
    loader = tdu.create_dataloader(
        str(root),
        packing=tdu.Packing("tokens", seq_len=seq_len, pad_value=-1),
        batch_size=batch,
        shuffle=True,
        num_workers=workers,
        persistent_workers=workers > 0,
    )
    return _epochs(loader, lambda b: int((b["input_ids"] >= 0).sum()))


def padded(root: Path, rows: int, workers: int) -> int:
    loader = tdu.create_dataloader(
        str(root),
        columns=["tokens"],
        batch_size=rows,
        shuffle=True,
        num_workers=workers,
        persistent_workers=workers > 0,
    )
    return _epochs(loader, lambda b: int(b["tokens_lengths"].sum()))


def _epochs(loader: tdu.TabularDataLoader, count: object) -> int:
    tokens = 0
    for epoch in range(2):  # the first warms the workers and the page cache
        loader.set_epoch(epoch)
        tokens = sum(count(b) for b in loader)  # type: ignore[operator]
    return tokens


def timed(run: object, repeat: int) -> tuple[float, int]:
    best, tokens = float("inf"), 0
    for _ in range(repeat):
        start = time.perf_counter()
        tokens = run()  # type: ignore[operator]
        best = min(best, time.perf_counter() - start)
    return best, tokens


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--documents", type=int, default=20_000)
    parser.add_argument("--seq-len", type=int, default=2048)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--repeat", type=int, default=2)
    args = parser.parse_args()
    root, total = make(args.documents)
    rows = max(1, args.seq_len * args.batch_size // 512)  # about as many tokens a batch
    print(
        f"{args.documents:,} documents, {total:,} tokens; seq_len {args.seq_len}, "
        f"batch {args.batch_size} sequences (padded: {rows} rows); best of {args.repeat}"
    )
    # The limit reads one epoch; ours two (the second timed): halve ours.
    base, _ = timed(lambda: limit(root, args.seq_len, args.batch_size), args.repeat)
    rate = total / base
    print(f"{'config':<22}{'tokens/s':>14}{'x limit':>10}")
    print(f"{'limit (concat+split)':<22}{rate:>14,.0f}{1.0:>10.2f}")
    for workers in (0, 2):
        for name, run in (
            ("packed", lambda w=workers: packed(root, args.seq_len, args.batch_size, w)),
            ("padded", lambda w=workers: padded(root, rows, w)),
        ):
            seconds, tokens = timed(run, args.repeat)
            ours = 2 * tokens / seconds
            print(f"{f'{name}, {workers} workers':<22}{ours:>14,.0f}{ours / rate:>10.2f}")


if __name__ == "__main__":
    main()
