"""Train with PyTorch Lightning on Parquet: ddp or ddp_spawn, mid-epoch checkpoints, predict.

Run it from the repository root (CPU: two processes with gloo; GPUs: ``--accelerator gpu``)::

    python examples/train_lightning.py                                  # ddp, 2 processes
    python examples/train_lightning.py --strategy ddp_spawn             # loader built here, pickled
    python examples/train_lightning.py --max-steps 25                   # "crash" after step 25
    python examples/train_lightning.py --resume /tmp/tdu_lightning/ckpt/step=20.ckpt
    python examples/train_lightning.py --predict                        # trainer.predict
    python examples/train_lightning.py --mixture                        # two sources, mixed
    python examples/train_lightning.py --packed --data /tmp/tdu_packed  # packed sequences

What it shows:

- ``train_dataloader()`` returns ``tdu.create_dataloader(...)`` unchanged. Each rank reads its
  own equal share; Lightning hands the epoch to ``loader.sampler.set_epoch``, which reaches the
  dataset, so every epoch has a new order. Nothing else is needed (``--set-epoch`` also calls
  ``loader.set_epoch`` in ``on_train_epoch_start``, which is harmless).
- With ``ddp_spawn`` the loader is built once in this process (planned once) and pickled into
  the ranks; each copy finds its rank where it lands.
- ``ModelCheckpoint(every_n_train_steps=...)`` saves the loader's state with the model;
  ``fit(ckpt_path=...)`` continues with the very batch that followed it.
- ``trainer.predict`` rebuilds the loader from its attributes: same rows, once each.
- ``--packed``: documents of token ids packed into sequences (``packing=tdu.Packing(...)``);
  Lightning moves, checkpoints and resumes the packed batches as any other; every token once.

With ``--out DIR`` every rank writes the row ids it read (per epoch and global step) to
``DIR/<tag>-rank<r>.json``; the test suite checks them (tests/trainers/test_lightning.py).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import tempfile
from pathlib import Path
from typing import Any

import lightning as L
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from torch import nn

import torch_dataloader_utils as tdu

FEATURES = [f"x{i}" for i in range(8)]
# --packed: documents of 0-29 tokens, TOKENS token ids in all (each once), sequences of SEQ_LEN.
TOKENS, SEQ_LEN, PAD, VOCAB = 3_017, 16, -1, 64
TMP = Path(tempfile.gettempdir()) / "tdu_lightning"


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--data", type=Path, default=TMP / "data")
    parser.add_argument("--checkpoints", type=Path, default=TMP / "ckpt")
    parser.add_argument("--strategy", default="ddp", choices=["ddp", "ddp_spawn"])
    parser.add_argument("--devices", type=int, default=2)
    parser.add_argument("--accelerator", default="cpu")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--workers", type=int, default=2, help="DataLoader workers per rank")
    parser.add_argument("--set-epoch", action="store_true", help="also call loader.set_epoch")
    parser.add_argument("--save-every", type=int, default=10, help="steps between checkpoints")
    parser.add_argument("--max-steps", type=int, default=-1, help="stop after this many steps")
    parser.add_argument("--resume", type=Path, help="a checkpoint to continue from")
    parser.add_argument("--predict", action="store_true", help="run trainer.predict instead")
    parser.add_argument("--out", type=Path, help="write the row ids each rank read here")
    parser.add_argument("--tag", default="run")
    parser.add_argument(
        "--mixture", action="store_true", help="read the files as two sources, mixed stratified"
    )
    parser.add_argument("--packed", action="store_true", help="packed sequences of token ids")
    return parser.parse_args()


def write_data(root: Path, rows: int = 4_000, files: int = 4, packed: bool = False) -> None:
    """A small synthetic dataset: ``id``, eight float features and a 0/1 label; or
    (``packed``) documents of token ids 0 to ``TOKENS - 1``."""
    if root.exists():
        return
    rng = np.random.default_rng(0)
    part = root.with_name(root.name + f".part{os.getpid()}")
    part.mkdir(parents=True)
    if packed:
        write_documents(part, rng, files)
    else:
        for i, ids in enumerate(np.array_split(np.arange(rows), files)):
            x = rng.normal(size=(len(ids), len(FEATURES))).astype("float32")
            columns = {"id": ids, **{f: x[:, j] for j, f in enumerate(FEATURES)}}
            columns["label"] = (x.sum(axis=1) > 0).astype("int64")
            pq.write_table(pa.table(columns), part / f"part-{i}.parquet", row_group_size=250)
    with contextlib.suppress(OSError):  # another process finished first
        part.rename(root)


def write_documents(root: Path, rng: np.random.Generator, files: int) -> None:
    """Documents of 0-29 tokens whose ids, 0 to ``TOKENS - 1``, are each in one document."""
    lengths: list[int] = []
    while sum(lengths) < TOKENS:
        lengths.append(min(int(rng.integers(0, 30)), TOKENS - sum(lengths)))
    starts = np.cumsum([0, *lengths])
    documents = [list(range(a, a + n)) for a, n in zip(starts.tolist(), lengths, strict=False)]
    for i, part in enumerate(np.array_split(np.arange(len(documents)), files)):
        tokens = pa.array([documents[d] for d in part], pa.list_(pa.int64()))
        pq.write_table(pa.table({"tokens": tokens}), root / f"part-{i}.parquet", row_group_size=20)


def make_loader(args: argparse.Namespace) -> tdu.TabularDataLoader:
    if args.packed:  # sequences of SEQ_LEN tokens, batch_size of them a batch
        return tdu.create_dataloader(
            str(args.data),
            packing=tdu.Packing("tokens", seq_len=SEQ_LEN, pad_value=PAD),
            batch_size=args.batch_size,
            shuffle=True,
            num_workers=args.workers,
        )
    if args.mixture:  # the same rows as two sources: every row once per epoch, each batch half-half
        files = sorted(str(f) for f in args.data.glob("*.parquet"))
        half = len(files) // 2
        return tdu.create_dataloader(
            [
                tdu.Source(files[:half], format="parquet", name="first"),
                tdu.Source(files[half:], format="parquet", name="second"),
            ],
            mixing="stratified",
            source_column="source",
            columns=["id", *FEATURES, "label"],
            batch_size=args.batch_size,
            shuffle=True,
            num_workers=args.workers,
        )
    return tdu.create_dataloader(
        str(args.data),
        format="parquet",
        columns=["id", *FEATURES, "label"],
        batch_size=args.batch_size,
        shuffle=True,
        num_workers=args.workers,
    )


class Classifier(L.LightningModule):
    def __init__(self, args: argparse.Namespace, loader: tdu.TabularDataLoader | None) -> None:
        super().__init__()
        self.args = args
        self.loader = loader  # built in this process (ddp_spawn), else in train_dataloader()
        # (DDP wants every parameter used: a packed batch's model has no other)
        self.net = nn.Embedding(VOCAB, 1) if args.packed else nn.Linear(len(FEATURES), 2)
        self.seen: list[dict[str, Any]] = []  # one entry per batch: epoch, step, ids

    def train_dataloader(self) -> tdu.TabularDataLoader:
        if self.loader is None:
            self.loader = make_loader(self.args)
        return self.loader

    def on_train_epoch_start(self) -> None:
        if self.args.set_epoch:
            self.train_dataloader().set_epoch(self.current_epoch)

    def training_step(self, batch: dict[str, Any], index: int) -> torch.Tensor:
        if self.args.packed:
            tokens = batch["input_ids"]
            real = tokens != PAD
            record = {"epoch": self.current_epoch, "step": self.global_step}
            self.seen.append({**record, "ids": tokens[real].tolist()})
            return self.net(tokens.clamp(min=0) % VOCAB)[real].pow(2).mean()
        x = torch.stack([batch[f] for f in FEATURES], dim=1)
        ids = batch["id"].tolist()
        record = {"epoch": self.current_epoch, "step": self.global_step, "ids": ids}
        if "source" in batch:  # --mixture: which source each row came from
            record["sources"] = batch["source"].tolist()
        self.seen.append(record)
        return nn.functional.cross_entropy(self.net(x), batch["label"])

    def predict_step(self, batch: dict[str, Any], index: int) -> list[int]:
        if self.args.packed:
            tokens = batch["input_ids"]
            ids: list[int] = tokens[tokens != PAD].tolist()
        else:
            ids = batch["id"].tolist()
        self.seen.append({"epoch": 0, "step": index, "ids": ids})
        return ids

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.1)

    def on_fit_end(self) -> None:
        self._write()

    def on_predict_end(self) -> None:
        self._write()

    def _write(self) -> None:
        out = self.args.out
        if out is not None:
            out.mkdir(parents=True, exist_ok=True)
            path = out / f"{self.args.tag}-rank{self.global_rank}.json"
            path.write_text(json.dumps(self.seen))


def main() -> None:
    args = parse_args()
    if int(os.environ.get("LOCAL_RANK", "0")) == 0:
        # ddp: rank 0 (this process) writes it before Lightning launches
        write_data(args.data, packed=args.packed)
    trainer = L.Trainer(
        accelerator=args.accelerator,
        devices=args.devices,
        strategy=args.strategy,
        max_epochs=args.epochs,
        max_steps=args.max_steps,
        callbacks=[
            ModelCheckpoint(
                dirpath=args.checkpoints,
                filename="{step}",
                every_n_train_steps=args.save_every,
                save_top_k=-1,
            )
        ],
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    # ddp_spawn pickles the module, loader included, into the ranks: build the loader here,
    # once. With ddp every rank runs this script and builds its own in train_dataloader().
    loader = make_loader(args) if args.strategy == "ddp_spawn" or args.predict else None
    model = Classifier(args, loader)
    if args.predict:
        assert loader is not None
        trainer.predict(model, dataloaders=loader, return_predictions=False)
    else:
        trainer.fit(model, ckpt_path=args.resume)


if __name__ == "__main__":
    main()
