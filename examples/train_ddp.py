"""Train a small classifier with DistributedDataParallel on Parquet, checkpoint it, resume it.

Run it from the repository root (CPU: the gloo backend; CUDA GPUs: nccl)::

    torchrun --standalone --nproc_per_node=2 examples/train_ddp.py
    torchrun --standalone --nproc_per_node=2 examples/train_ddp.py --max-steps 25  # "crash"
    torchrun --standalone --nproc_per_node=2 examples/train_ddp.py --resume

What it shows:

- ``create_dataloader`` finds the rank and world size in the initialised process group; rank 0
  lists the files and reads the footers, the other ranks receive that plan. Every rank reads
  its own equal share of each epoch, so every rank runs the same number of steps.
- ``loader.set_epoch(epoch)`` before each epoch: a new shuffle every epoch.
- Every ``--save-every`` steps rank 0 saves one checkpoint: the model, the optimizer and
  ``loader.state_dict()`` (a few integers, the same on every rank). ``--resume`` loads it and
  continues with the very batch that followed it, on the same number of ranks or on another
  (the rows the old ranks had not read yet are dealt to the new ones).
- If the data has an ``id`` column (the generated data does), it also counts how often each row
  was read and reports it per epoch: once each, across ranks, also across a resume.

``--data`` names a folder of Parquet files with columns ``x0``..``x7`` (float) and ``label``
(0..2); if it does not exist, rank 0 writes a small synthetic dataset there first.
"""

from __future__ import annotations

import argparse
import os
import tempfile
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

import torch_dataloader_utils as tdu

FEATURES = [f"x{i}" for i in range(8)]
NUM_CLASSES = 3
TMP = Path(tempfile.gettempdir())


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--data", type=Path, default=TMP / "tdu_train_ddp" / "data")
    parser.add_argument("--checkpoint", type=Path, default=TMP / "tdu_train_ddp" / "ckpt.pt")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--workers", type=int, default=2, help="DataLoader workers per rank")
    parser.add_argument("--save-every", type=int, default=10, help="steps between checkpoints")
    parser.add_argument("--max-steps", type=int, default=0, help="stop after this many steps")
    parser.add_argument("--resume", action="store_true", help="continue from --checkpoint")
    return parser.parse_args()


def write_dataset(root: Path, *, files: int = 4, rows: int = 2_500, seed: int = 0) -> None:
    """Parquet files whose ``label`` is a noisy linear function of the features."""
    rng = np.random.default_rng(seed)
    weights = rng.normal(size=(len(FEATURES), NUM_CLASSES))
    partial = root.with_name(root.name + ".partial")
    partial.mkdir(parents=True, exist_ok=True)
    for i in range(files):
        x = rng.normal(size=(rows, len(FEATURES))).astype(np.float32)
        label = (x @ weights + rng.normal(scale=0.5, size=(rows, NUM_CLASSES))).argmax(axis=1)
        columns = {"id": np.arange(i * rows, (i + 1) * rows)}
        columns.update({name: x[:, j] for j, name in enumerate(FEATURES)})
        columns["label"] = label.astype(np.int64)
        pq.write_table(pa.table(columns), partial / f"part-{i:03d}.parquet", row_group_size=500)
    partial.rename(root)  # whole or not at all


def save(path: Path, **checkpoint: object) -> None:
    """Write ``checkpoint`` atomically: a crash while saving leaves the previous one."""
    partial = path.with_name(path.name + ".partial")
    torch.save(checkpoint, partial)
    os.replace(partial, path)


def report(epoch: int, seen: torch.Tensor | None, rows: int) -> None:
    """Print, on rank 0, the rows all ranks read in ``epoch`` and how often each was read."""
    total = torch.tensor([rows])
    dist.all_reduce(total)
    if seen is not None:
        dist.all_reduce(seen)
    if dist.get_rank() != 0:
        return
    line = f"epoch {epoch}: {int(total)} rows in this run"
    if seen is not None:
        once, more, never = (int(n.sum()) for n in (seen == 1, seen > 1, seen == 0))
        line += f"; rows of the epoch read once: {once}, more often: {more}, never: {never}"
    print(line, flush=True)


def main() -> None:
    args = parse_args()
    dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo")
    train(args)
    # After train() returned: its DDP model, which holds the group, is gone.
    dist.barrier()
    dist.destroy_process_group()


def train(args: argparse.Namespace) -> None:
    """Train ``args.epochs`` epochs (or ``args.max_steps`` steps), saving checkpoints."""
    cuda = torch.cuda.is_available()
    rank = dist.get_rank()
    device = torch.device(f"cuda:{os.environ.get('LOCAL_RANK', '0')}" if cuda else "cpu")
    if cuda:
        torch.cuda.set_device(device)

    if rank == 0 and not args.data.exists():
        write_dataset(args.data)
    dist.barrier()  # the data is there before any rank plans

    loader = tdu.create_dataloader(
        str(args.data),
        batch_size=args.batch_size,
        shuffle=True,
        num_workers=args.workers,
        pin_memory=cuda,
        device=device,  # batches arrive on this rank's device
    )
    num_rows = loader.dataset.plan.num_rows
    if rank == 0:
        print(f"{dist.get_world_size()} ranks, {len(loader)} batches per rank per epoch")

    torch.manual_seed(0)  # the same initial weights on every rank
    model = nn.Sequential(nn.Linear(len(FEATURES), 32), nn.ReLU(), nn.Linear(32, NUM_CLASSES))
    model = DistributedDataParallel(model.to(device), device_ids=[device.index] if cuda else None)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    loss_fn = nn.CrossEntropyLoss()

    # Row ids, if the data has them: how often each row was read in the current epoch.
    count_rows = "id" in loader.dataset.plan.schema.names
    step, start_epoch, seen = 0, 0, None
    if args.resume:
        checkpoint = torch.load(args.checkpoint, map_location="cpu", weights_only=True)
        model.module.load_state_dict(checkpoint["model"])
        optimizer.load_state_dict(checkpoint["optimizer"])
        loader.load_state_dict(checkpoint["loader"])
        step = checkpoint["step"]
        # The loaded state knows its epoch (a complete one resumes at its end: nothing left).
        start_epoch = loader.dataset.epoch
        if count_rows and start_epoch == checkpoint["loader"]["epoch"]:
            # The counts of all ranks, summed; kept on rank 0 so the next sum counts them once.
            seen = checkpoint["seen"] if rank == 0 else torch.zeros_like(checkpoint["seen"])
        if rank == 0:
            print(f"resumed from step {step} in epoch {start_epoch}", flush=True)

    for epoch in range(start_epoch, args.epochs):
        loader.set_epoch(epoch)  # keeps a loaded state of this epoch
        if seen is None:
            seen = torch.zeros(num_rows, dtype=torch.int64)
        rows = 0
        for batch in loader:  # a dict of tensors, one per column
            x = torch.stack([batch[name] for name in FEATURES], dim=1)
            loss = loss_fn(model(x), batch["label"])
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            step += 1
            rows += len(x)
            if count_rows:
                seen += torch.bincount(batch["id"].cpu(), minlength=num_rows)
            if step % args.save_every == 0:
                # A collective: every rank joins to sum the counts.
                total = seen.clone()
                dist.all_reduce(total)
                if rank == 0:  # the loader state is the same on every rank
                    save(
                        args.checkpoint,
                        model=model.module.state_dict(),
                        optimizer=optimizer.state_dict(),
                        loader=loader.state_dict(),
                        step=step,
                        seen=total,
                    )
            if step == args.max_steps:
                if rank == 0:
                    print(f"stopping at step {step}, loss {loss.item():.4f}", flush=True)
                return
        report(epoch, seen if count_rows else None, rows)
        seen = None


if __name__ == "__main__":
    main()
