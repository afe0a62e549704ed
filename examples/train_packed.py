"""Pre-train a tiny causal LM on packed sequences, stop mid-epoch and resume: every token once.

Run it from the repository root::

    python examples/train_packed.py

What it shows:

- ``packing=tdu.Packing(column="tokens", seq_len=...)`` turns documents of token ids (lists of
  LLM-like lengths, 32-992 tokens) into batches of ``[batch_size, seq_len]`` sequences with
  ``position_ids`` (each token's position in its fragment, from 0) and
  ``cu_seqlens``/``max_seqlen`` (the document boundaries, for varlen attention such as
  FlashAttention's).
- Every token is read once per epoch, a document longer than ``seq_len`` continues in the next
  sequence, and only a stream's last sequence is padded.
- ``loader.state_dict()`` mid-epoch, a new loader (here with another number of workers),
  ``load_state_dict``: the rest of the epoch, nothing lost or read twice.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from collections import Counter
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import torch
from torch import nn

import torch_dataloader_utils as tdu

VOCAB, DOCUMENTS, PAD = 4096, 600, -1


def write_corpus(root: Path) -> int:
    """Documents of 32-992 tokens whose ids are unique (so reads can be checked); returns the
    number of tokens."""
    rng = np.random.default_rng(0)
    token = 0
    for part in range(4):
        documents = []
        for _ in range(DOCUMENTS // 4):
            n = int(rng.integers(32, 993))
            documents.append(np.arange(token, token + n))
            token += n
        table = pa.table({"tokens": pa.array(documents, pa.list_(pa.int64()))})
        pq.write_table(table, root / f"part-{part}.parquet", row_group_size=50)
    return token


class TinyLM(nn.Module):
    def __init__(self, seq_len: int) -> None:
        super().__init__()
        self.tokens = nn.Embedding(VOCAB, 32)
        self.positions = nn.Embedding(seq_len, 32)  # (positions count from 0 in a fragment)
        self.head = nn.Linear(32, VOCAB)

    def forward(self, input_ids: torch.Tensor, position_ids: torch.Tensor) -> torch.Tensor:
        hidden = self.tokens(input_ids % VOCAB) + self.positions(position_ids)
        return self.head(hidden)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--data",
        type=Path,
        help="where to write the corpus (default: a temporary folder, removed at the end)",
    )
    parser.add_argument("--seq-len", type=int, default=256)
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args()
    if args.data is not None:
        train(args, args.data)
        return
    with tempfile.TemporaryDirectory(prefix="tdu-packed-") as folder:
        train(args, Path(folder))


def train(args: argparse.Namespace, data: Path) -> None:
    """Write the corpus under ``data``, train half an epoch, resume for the rest."""
    data.mkdir(parents=True, exist_ok=True)
    total = write_corpus(data)

    def build(workers: int) -> tdu.TabularDataLoader:
        return tdu.create_dataloader(
            str(data),
            packing=tdu.Packing(column="tokens", seq_len=args.seq_len, pad_value=PAD),
            batch_size=args.batch_size,
            shuffle=True,
            num_workers=workers,
        )

    model = TinyLM(args.seq_len)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    seen: Counter[int] = Counter()
    slots = padded = 0

    def step(batch: dict[str, torch.Tensor]) -> None:
        nonlocal slots, padded
        ids, positions = batch["input_ids"], batch["position_ids"]
        real = ids != PAD
        seen.update(ids[real].tolist())
        slots += ids.numel()
        padded += int((~real).sum())
        logits = model(ids.clamp(min=0)[:, :-1], positions[:, :-1])
        target = ids[:, 1:].clamp(min=0) % VOCAB
        # A token's next one is a target only inside its document (cu_seqlens' fragments).
        same = batch["document_ids"][:, 1:] == batch["document_ids"][:, :-1]
        loss = nn.functional.cross_entropy(logits[same], target[same])
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()

    start = time.perf_counter()
    loader = build(args.workers)
    batches = len(loader)
    stop_at = batches // 2
    for i, batch in enumerate(loader):
        step(batch)
        if i + 1 == stop_at:
            break
    state = loader.state_dict()  # mid-epoch: a checkpoint
    del loader
    resumed = build(0 if args.workers else 2)  # another number of workers
    resumed.load_state_dict(state)
    for batch in resumed:
        step(batch)
    seconds = time.perf_counter() - start
    once = len(seen) == total and max(seen.values()) == 1
    print(
        f"{total:,} tokens in {batches} batches of {args.batch_size} x {args.seq_len}; "
        f"fill {1 - padded / slots:.4f}; {total / seconds:,.0f} tokens/s with the model's step; "
        f"stopped after {stop_at} batches and resumed; every token exactly once: "
        f"{'yes' if once else 'NO'}"
    )
    if not once:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
