"""Train a Hugging Face transformers model on packed sequences, checkpoint and resume exactly.

Run it from the repository root::

    python examples/train_hf_packed.py                     # sdpa
    python examples/train_hf_packed.py --attn eager

What it shows:

- A ``LlamaForCausalLM`` built from a config (random weights, nothing downloaded) trained on
  ``packing=tdu.Packing(..., static_shape=True)``: every batch ``[batch_size, seq_len]``, the
  last one padded, and ``position_ids`` counting from 0 in every fragment, so the model keeps
  attention inside each document (docs/how-to/llm.md).
- ``tdu.attention.hf_inputs(batch, attn)`` gives the model call's keywords for the model's
  attention implementation: ``position_ids``, ``use_cache=False`` (a cache turns transformers'
  packed-sequence detection off), labels that never cross a document, and for FlashAttention
  ``cu_seq_lens_q/k``.
- A checkpoint mid-epoch (model, optimizer and ``loader.state_dict()``), a new process's worth
  of objects built from it, and the rest of the run: the weights at the end are those of a run
  that never stopped, and every token of each epoch was read exactly once.
"""

from __future__ import annotations

import argparse
import tempfile
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import torch
from transformers import LlamaConfig, LlamaForCausalLM

import torch_dataloader_utils as tdu
from torch_dataloader_utils.attention import hf_inputs

VOCAB, PAD = 1024, -1


def write_corpus(root: Path, documents: int) -> int:
    """Documents of 8-400 tokens whose ids are unique (so reads can be checked); the model
    sees ``id % VOCAB``, so each next token is the one after: a pattern it learns. Returns the
    number of tokens."""
    rng = np.random.default_rng(0)
    token = 0
    for part in range(4):
        rows = []
        for _ in range(documents // 4):
            n = int(rng.integers(8, 401))
            rows.append(np.arange(token, token + n))
            token += n
        table = pa.table({"tokens": pa.array(rows, pa.list_(pa.int64()))})
        pq.write_table(table, root / f"part-{part}.parquet", row_group_size=16)
    return token


class Run:
    """A model, its optimizer and the loader, built the same way for a fresh start and for a
    resume."""

    def __init__(self, args: argparse.Namespace) -> None:
        torch.manual_seed(0)
        config = LlamaConfig(
            vocab_size=VOCAB,
            hidden_size=64,
            intermediate_size=128,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            max_position_embeddings=args.seq_len,  # positions never pass seq_len
            attn_implementation=args.attn,
        )
        self.model = LlamaForCausalLM(config)
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=3e-3)
        self.loader = tdu.create_dataloader(
            str(args.data),
            packing=tdu.Packing(
                column="tokens", seq_len=args.seq_len, pad_value=PAD, static_shape=True
            ),
            batch_size=args.batch_size,
            shuffle=True,
            shuffle_seed=1,
            num_workers=args.workers,
        )
        self.attn = args.attn
        self.shapes: set[tuple[int, ...]] = set()

    def step(self, batch: dict[str, Any], seen: Counter[int]) -> float:
        ids = batch["input_ids"]
        seen.update(ids[ids != PAD].tolist())
        self.shapes.add(tuple(ids.shape))
        inputs = hf_inputs(batch, self.attn)
        inputs["input_ids"] = inputs["input_ids"].clamp(min=0) % VOCAB
        inputs["labels"] = torch.where(inputs["labels"] >= 0, inputs["labels"] % VOCAB, -100)
        loss = self.model(**inputs).loss
        self.optimizer.zero_grad()
        loss.backward()
        self.optimizer.step()
        return float(loss.detach())

    def save(self, path: Path, epoch: int) -> None:
        torch.save(
            {
                "model": self.model.state_dict(),
                "optimizer": self.optimizer.state_dict(),
                "data": self.loader.state_dict(),
                "epoch": epoch,
            },
            path,
        )

    def load(self, path: Path) -> int:
        saved = torch.load(path, weights_only=False)
        self.model.load_state_dict(saved["model"])
        self.optimizer.load_state_dict(saved["optimizer"])
        self.loader.load_state_dict(saved["data"])
        return int(saved["epoch"])


def train(
    args: argparse.Namespace, total: int, checkpoint: Path | None
) -> tuple[Run, list[float], bool]:
    """Train ``args.epochs`` epochs; with ``checkpoint``, stop halfway through the first epoch,
    save, and go on in new objects built from the checkpoint. Returns the last run, the losses
    and whether every epoch read every token once."""
    run = Run(args)
    losses: list[float] = []
    once = True
    for epoch in range(args.epochs):
        run.loader.set_epoch(epoch)
        seen: Counter[int] = Counter()
        stop_at = len(run.loader) // 2 if checkpoint is not None and epoch == 0 else None
        for i, batch in enumerate(run.loader):
            losses.append(run.step(batch, seen))
            if i + 1 == stop_at:
                break
        if stop_at is not None and checkpoint is not None:  # the checkpoint, and a restart
            run.save(checkpoint, epoch)
            run = Run(args)  # everything anew, as in a new process
            assert run.load(checkpoint) == epoch
            for batch in run.loader:  # the rest of the epoch
                losses.append(run.step(batch, seen))
        once &= seen == Counter(range(total))
    return run, losses, once


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--attn", default="sdpa", help="the model's attn_implementation")
    parser.add_argument("--seq-len", type=int, default=128)
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--documents", type=int, default=300)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="tdu-hf-packed-") as tmp:
        args.data = Path(tmp) / "corpus"
        args.data.mkdir()
        total = write_corpus(args.data, args.documents)
        straight, losses, once = train(args, total, checkpoint=None)
        resumed, resumed_losses, resumed_once = train(args, total, Path(tmp) / "checkpoint.pt")
    same = all(
        torch.equal(a, b)
        for a, b in zip(
            straight.model.state_dict().values(), resumed.model.state_dict().values(), strict=True
        )
    )
    print(
        f"{len(losses)} steps over {args.epochs} epochs of {total:,} tokens "
        f"({args.attn}, batches {sorted(resumed.shapes)}); loss {losses[0]:.3f} -> "
        f"{np.mean(losses[-10:]):.3f}; every token exactly once per epoch: "
        f"{'yes' if once and resumed_once else 'NO'}; resumed from a mid-epoch checkpoint, "
        f"the same weights as without stopping: {'yes' if same else 'NO'}"
    )
    if not (once and resumed_once and same and losses == resumed_losses):
        raise SystemExit(1)


if __name__ == "__main__":
    main()
