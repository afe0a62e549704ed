"""Packed sequences against the padded read of the same documents and against the limit.

The limit: pyarrow reads the token-list column, numpy concatenates the values and cuts them into
``[batch, seq_len]`` sequences (no shuffle, no boundaries): what packing must at least do. Ours:
``create_dataloader(packing=Packing(...), shuffle=True)`` and the padded one-row-per-document
read of the same column (``batch_size`` rows holding about as many tokens as a packed batch),
``num_workers`` 0 and 2. Tokens/s counts real tokens (padding excluded) over whole epochs after
a first one (workers started, page cache warm): each configuration's best epoch of
``--repeat`` loaders, 3 timed epochs each.

``CPU x padded``: the least CPU seconds a token over the timed epochs (the main process's and
its workers' together) against the padded read's. With 2 workers and the main process on 2
cores the wall clock moves with the scheduler far more than the CPU does.

Token-budget batches (``batching=TokenBudget(max_tokens=batch_size * seq_len)``) of the same
column are timed beside them, and an untimed epoch says how much of their padded slots are real
tokens and how full of the budget the batches are.

Best fit (``method="best_fit"``, in-process, ``--fills``) is timed the same way, and an untimed
epoch says how it arranges: fill (real tokens over the batches' slots), the documents split
across sequences inside a batch and those cut at a batch's ends (per document, concat's beside
it), and the microseconds the arrangement alone takes a batch (``pack_best_fit`` against
``pack`` on the same shuffled fragments).

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
from throughput import cpu_seconds  # this folder
from torch_dataloader_utils.planning.shuffle import document_permutation
from torch_dataloader_utils.stream.fragments import Fragments
from torch_dataloader_utils.stream.packing import pack, pack_best_fit

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


def packed_loader(
    root: Path,
    seq_len: int,
    batch: int,
    workers: int,
    method: str = "concat",
    fill: float = 0.95,
    positions: str = "fragment",
) -> tdu.TabularDataLoader:
    packing = tdu.Packing(
        "tokens", seq_len, pad_value=-1, method=method, fill=fill, positions=positions
    )
    return tdu.create_dataloader(
        str(root),
        packing=packing,
        batch_size=batch,
        shuffle=True,
        num_workers=workers,
        persistent_workers=workers > 0,
    )


def packed(
    root: Path, seq_len: int, batch: int, workers: int, total: int, **method: object
) -> tuple[float, float]:
    loader = packed_loader(root, seq_len, batch, workers, **method)  # type: ignore[arg-type]
    if method.get("method", "concat") == "concat":  # padding only ends a batch's last sequence
        return _epochs(
            loader,
            lambda b: b["input_ids"].numel() - int((b["document_ids"][-1] < 0).sum()),
            total,
        )
    return _epochs(loader, lambda b: int((b["document_ids"] >= 0).sum()), total)


def arrangement(root: Path, seq_len: int, batch: int, **method: object) -> dict[str, float]:
    """One epoch's fill, and the documents split inside a batch (a document in more than one of
    its sequences) and cut at its ends (going on from the batch before), per document."""
    real = slots = split = cut = 0
    # (positions in documents: a piece that goes on from the batch before starts above 0)
    loader = packed_loader(root, seq_len, batch, 0, positions="document", **method)  # type: ignore[arg-type]
    for b in loader:
        ids = b["document_ids"].numpy()
        positions = b["position_ids"].numpy()[ids >= 0]
        real, slots = real + int((ids >= 0).sum()), slots + ids.size
        documents = ids[ids >= 0]
        pairs = np.unique(np.stack([np.nonzero(ids >= 0)[0], documents]), axis=1)
        split += int((np.bincount(pairs[1]) > 1).sum())
        first = np.full(int(documents.max()) + 1, np.iinfo(np.int32).max)
        np.minimum.at(first, documents, positions)
        cut += int((first[first < np.iinfo(np.int32).max] > 0).sum())
    count = len(pq.read_table(root, columns=["tokens"]))
    return {"fill": real / slots, "split": split / count, "cut": cut / count}


def arrange_us(root: Path, seq_len: int, batch: int, fill: float) -> tuple[float, float]:
    """Microseconds a batch takes to arrange: concat's ``pack``, then ``pack_best_fit``."""
    column = pq.read_table(root, columns=["tokens"]).column("tokens")
    fragments = Fragments.from_lists(column, 0)
    order = document_permutation(len(fragments.begin), seed=0, epoch=0, stream=0, block=0)
    fragments = fragments.permuted(order)
    budget = tdu.Packing("tokens", seq_len, method="best_fit", fill=fill).batch_tokens(batch)
    out = []
    for tokens, run in (
        (batch * seq_len, lambda f: pack(f, seq_len)),
        (budget, lambda f: pack_best_fit(f, seq_len, batch, budget=budget)),
    ):
        batches = [fragments.slice(at, tokens) for at in range(0, fragments.num_rows, tokens)]
        best = float("inf")
        for _ in range(3):  # (the best of three: a shared machine's noise is all upward)
            start = time.perf_counter()
            for part in batches:
                run(part)
            best = min(best, time.perf_counter() - start)
        out.append(best / len(batches) * 1e6)
    return out[0], out[1]


def padded(root: Path, rows: int, workers: int, total: int) -> tuple[float, float]:
    loader = tdu.create_dataloader(
        str(root),
        columns=["tokens"],
        batch_size=rows,
        shuffle=True,
        num_workers=workers,
        persistent_workers=workers > 0,
    )
    return _epochs(loader, lambda b: int(b["tokens_lengths"].sum()), total)


def budgeted(root: Path, max_tokens: int, workers: int, total: int) -> tuple[float, float]:
    """Token-budget batches (``batching=TokenBudget``) of the same column: real tokens/s."""
    loader = tdu.create_dataloader(
        str(root),
        batching=tdu.TokenBudget("tokens", max_tokens=max_tokens),
        shuffle=True,
        num_workers=workers,
        persistent_workers=workers > 0,
    )
    return _epochs(loader, lambda b: int(b["tokens_lengths"].sum()), total)


def budget_shares(root: Path, max_tokens: int) -> dict[str, float]:
    """One epoch of token-budget batches: real tokens over the padded slots (rows x longest),
    and the padded slots over the budgets (how full each batch is)."""
    loader = tdu.create_dataloader(
        str(root), batching=tdu.TokenBudget("tokens", max_tokens=max_tokens), shuffle=True
    )
    real = slots = batches = 0
    for batch in loader:
        rows, width = batch["tokens"].shape
        real += int(batch["tokens_lengths"].sum())
        slots += rows * width
        batches += 1
    return {"real/slots": real / slots, "slots/budget": slots / (batches * max_tokens)}


def _epochs(loader: tdu.TabularDataLoader, count: object, total: int) -> tuple[float, float]:
    """Tokens/s of the loader's best epoch after a first one (which starts the workers and
    warms the page cache): the steady state a training run sees; and the least CPU seconds
    per million tokens of those epochs, this process's and its workers' together (steadier
    than the wall clock where two workers and the main process share two cores).

    The first epoch counts the real tokens of every batch (``count``) and must find the
    data's ``total``; the timed ones only take the batches, every token once as the first
    found: counting costs the main process a few tensor operations a batch, more for packed
    batches (padding in the last sequence) than for padded ones (a sum of lengths), and on
    two cores that is time the workers do not get."""
    best, least = 0.0, float("inf")
    for epoch in range(1 + EPOCHS):
        loader.set_epoch(epoch)
        cpu = sum(cpu_seconds())
        start = time.perf_counter()
        if epoch:
            for _ in loader:
                pass
            best = max(best, total / (time.perf_counter() - start))
            least = min(least, (sum(cpu_seconds()) - cpu) / total * 1e6)
            continue
        tokens = sum(count(b) for b in loader)  # type: ignore[operator]
        if tokens != total:
            raise SystemExit(f"an epoch read {tokens:,} real tokens, the data has {total:,}")
    return best, least


# Epochs timed after the first, the best kept.
EPOCHS = 3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--documents", type=int, default=20_000)
    parser.add_argument("--seq-len", type=int, default=2048)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--fills", type=float, nargs="*", default=[0.9, 0.95, 0.98])
    args = parser.parse_args()
    root, total = make(args.documents)
    rows = max(1, args.seq_len * args.batch_size // 512)  # about as many tokens a batch
    print(
        f"{args.documents:,} documents, {total:,} tokens; seq_len {args.seq_len}, "
        f"batch {args.batch_size} sequences (padded: {rows} rows); best of {args.repeat}"
    )
    rate = 0.0
    for _ in range(args.repeat):  # (the limit: the best of its epochs too)
        start = time.perf_counter()
        limit(root, args.seq_len, args.batch_size)
        rate = max(rate, total / (time.perf_counter() - start))
    budget = args.seq_len * args.batch_size
    print(f"{'config':<26}{'tokens/s':>14}{'x limit':>10}{'x padded':>10}{'CPU x padded':>14}")
    print(f"{'limit (concat+split)':<26}{rate:>14,.0f}{1.0:>10.2f}")
    for workers in (0, 2):
        runs = {
            "padded": lambda w=workers: padded(root, rows, w, total),
            "packed": lambda w=workers: packed(root, args.seq_len, args.batch_size, w, total),
            f"budget {budget}": lambda w=workers: budgeted(root, budget, w, total),
        }
        speeds = dict.fromkeys(runs, 0.0)
        cpus = dict.fromkeys(runs, float("inf"))  # CPU seconds a million tokens
        for _ in range(args.repeat):  # (rounds interleaved: the machine's drift hits all alike)
            for name, run in runs.items():
                speed, cpu = run()
                speeds[name], cpus[name] = max(speeds[name], speed), min(cpus[name], cpu)
        for name, ours in speeds.items():
            label = f"{name}, {workers} workers"
            ratio, cpu_ratio = ours / speeds["padded"], cpus[name] / cpus["padded"]
            print(f"{label:<26}{ours:>14,.0f}{ours / rate:>10.2f}{ratio:>10.2f}{cpu_ratio:>14.2f}")
    where = (root, args.seq_len, args.batch_size)
    for fill in args.fills:
        runs = range(args.repeat)
        ours = max(packed(*where, 0, total, method="best_fit", fill=fill)[0] for _ in runs)
        print(f"{f'best_fit {fill}, 0 workers':<26}{ours:>14,.0f}{ours / rate:>10.2f}")
    print(f"\n{'arrangement':<26}{'fill':>8}{'split':>8}{'cut':>8}{'us/batch':>10}")
    for method, fill in (("concat", 1.0), *(("best_fit", f) for f in args.fills)):
        shares = arrangement(*where, method=method, fill=fill)
        us = arrange_us(*where, fill)[method == "best_fit"]
        label = method if method == "concat" else f"best_fit {fill}"
        print(
            f"{label:<26}{shares['fill']:>8.1%}{shares['split']:>8.2%}{shares['cut']:>8.1%}"
            f"{us:>10.0f}"
        )
    shares = budget_shares(root, budget)
    print(
        f"\ntoken budget {budget}: real tokens {shares['real/slots']:.1%} of the padded "
        f"slots, padded slots {shares['slots/budget']:.1%} of the budget"
    )


if __name__ == "__main__":
    main()
