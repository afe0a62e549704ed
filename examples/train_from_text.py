"""Train a tiny causal LM from raw text tokenized inside the loader: every token once an epoch.

Run it from the repository root::

    python examples/train_from_text.py                  # a corpus in a temporary folder
    python examples/train_from_text.py --data /tmp/tdu-text --steps 50

What it shows:

- ``tokenize=tdu.Tokenize(column="text", tokenizer=tok, eos_token=...)`` tokenizes a Parquet
  column of raw text in the DataLoader's workers, every epoch (``tok``: a byte-level BPE
  trained here in seconds with `tokenizers`); no pre-tokenized copy is written.
- Before epoch 0 the census counts each chunk's tokens once, in threads over the cores, so
  ``packing=tdu.Packing(...)`` plans as over pre-tokenized data; a second loader with the same
  ``cache_dir`` plans from what the first kept.
- A ``LlamaForCausalLM`` built from a config trains on the packed batches: ``position_ids``
  restart at 0 in each document, so with ``attention_mask=None`` sdpa attends within it.
  Each epoch's real tokens (``document_ids >= 0``) are checked against the corpus tokenized
  in one process: the same multiset.
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
from tokenizers import Tokenizer, models, pre_tokenizers, trainers
from transformers import LlamaConfig, LlamaForCausalLM

import torch_dataloader_utils as tdu
from torch_dataloader_utils.attention import labels

WORDS = (  # (split when the corpus is written)
    "the a of data loader token model train epoch shuffle batch text corpus every once "
    "river stone light garden window paper quiet bright slowly reads writes counts learns "
    "café naïve Zürich façade über déjà Ελλάδα данные 東京 数据 こんにちは 🙂 🚀"
)


def write_corpus(root: Path, rows: int) -> list[str]:
    """3 Parquet files of ``rows`` documents (1-12 sentences) with an ``id``; returns every
    text, in file order."""
    rng = np.random.default_rng(0)
    words = WORDS.split()
    texts: list[str] = []
    for part in range(3):
        batch = []
        for _ in range(rows):
            sentences = []
            for _ in range(int(rng.integers(1, 13))):
                picked = [str(w) for w in rng.choice(words, int(rng.integers(4, 17)))]
                if rng.random() < 0.2:
                    picked.append(str(int(rng.integers(0, 10_000))))
                sentences.append(" ".join(picked).capitalize() + str(rng.choice([".", "!", "?"])))
            batch.append(" ".join(sentences))
        table = pa.table({"id": np.arange(part * rows, (part + 1) * rows), "text": batch})
        pq.write_table(table, root / f"part-{part}.parquet", row_group_size=500)
        texts += batch
    return texts


def train_tokenizer(texts: list[str], vocab: int) -> Tokenizer:
    """A byte-level BPE with an end-of-text token (deterministic: same texts, same ids)."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    trainer = trainers.BpeTrainer(
        vocab_size=vocab,
        special_tokens=["<|endoftext|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer)
    return tok


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--data", type=Path, help="corpus and cache (default: a temp folder)")
    parser.add_argument("--rows", type=int, default=2000, help="documents in each of 3 files")
    for flag, default in (("vocab", 2000), ("seq-len", 256), ("batch-size", 8), ("workers", 2)):
        parser.add_argument(f"--{flag}", type=int, default=default)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--steps", type=int, default=20, help="optimizer steps per epoch")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="tdu-text-") as folder:
        train(args, args.data or Path(folder))


def train(args: argparse.Namespace, root: Path) -> None:
    """Write the corpus under ``root``, train the tokenizer, then the model for the epochs."""
    (root / "corpus").mkdir(parents=True, exist_ok=True)
    texts = write_corpus(root / "corpus", args.rows)
    tok = train_tokenizer(texts, args.vocab)
    eos = tok.token_to_id("<|endoftext|>")
    oracle: Counter[int] = Counter()  # the whole corpus tokenized in one process
    for encoding in tok.encode_batch(texts, add_special_tokens=False):
        oracle.update([*encoding.ids, eos])

    def build() -> tdu.TabularDataLoader:
        return tdu.create_dataloader(
            str(root / "corpus"),
            format="parquet",
            columns=["text"],
            tokenize=tdu.Tokenize(column="text", tokenizer=tok, output="tokens", eos_token=eos),
            packing=tdu.Packing(column="tokens", seq_len=args.seq_len, pad_value=0),
            batch_size=args.batch_size,
            shuffle=True,
            num_workers=args.workers,
            cache_dir=str(root / "cache"),
        )

    start = time.perf_counter()
    loader = build()  # the census: every chunk tokenized once, in threads
    census = time.perf_counter() - start
    start = time.perf_counter()
    build()  # the same listing and cache_dir: the census and the plan are kept
    kept = time.perf_counter() - start
    print(
        f"{len(texts):,} documents, {sum(oracle.values()):,} tokens (vocab "
        f"{tok.get_vocab_size()}); planning: {census:.2f} s with the census, {kept:.3f} s "
        f"for a second loader (census kept); {len(loader)} batches an epoch"
    )

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=tok.get_vocab_size(),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=4,
        max_position_embeddings=args.seq_len,
        use_cache=False,  # (a cache turns transformers' packed-sequence detection off)
        attn_implementation="sdpa",
    )
    model = LlamaForCausalLM(config)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    failed = False
    for epoch in range(args.epochs):
        loader.set_epoch(epoch)
        seen: Counter[int] = Counter()
        losses = []
        for i, batch in enumerate(loader):  # every batch, to check the whole epoch
            ids = batch["input_ids"]
            seen.update(ids[batch["document_ids"] >= 0].tolist())
            if i >= args.steps:
                continue
            # -100 on padding and on each document's first token: no target crosses documents
            loss = model(
                input_ids=ids.long(),
                position_ids=batch["position_ids"].long(),  # packed: read from these
                attention_mask=None,
                labels=labels(batch),
            ).loss
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            losses.append(loss.item())
        once = seen == oracle
        failed |= not once
        trained = f"loss {losses[0]:.2f} -> {losses[-1]:.2f}" if losses else "no step"
        print(f"epoch {epoch}: {sum(seen.values())} tokens, each once: {once} ({trained})")
    if failed:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
