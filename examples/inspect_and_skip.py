"""Debug a loss spike: look the batch up, skip it, resume. Every other row still once.

Run it from the repository root::

    python examples/inspect_and_skip.py

What it shows:

- A small regression trains on Parquet rows; a few rows hold corrupted labels, and the batch
  that holds them makes the loss spike.
- ``loader.rows_at(step, epoch=...)`` gives that batch's rows (with ``__file__`` and
  ``__row__``) from the plan, without iterating: the corrupted rows, named by file and row.
- ``loader.skip(epoch=..., batches=range(step, step + 1))`` leaves the batch out; the skip is
  part of ``loader.state_dict()``, so the run restarted from a checkpoint skips it too, and
  reads every other row once.
"""

from __future__ import annotations

import argparse
import tempfile
from collections import Counter
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import torch

import torch_dataloader_utils as tdu

ROWS, BAD = 4000, (1234, 1235, 3001)


def write(root: Path) -> None:
    """``x`` and ``y = 2x + 1``, except a few rows whose ``y`` is corrupted."""
    rng = np.random.default_rng(0)
    for part in range(4):
        ids = np.arange(part * ROWS // 4, (part + 1) * ROWS // 4)
        x = rng.random(len(ids)).astype(np.float32)
        y = 2 * x + 1
        y[np.isin(ids, BAD)] = 1e4
        table = pa.table({"id": ids, "x": x, "y": y.astype(np.float32)})
        pq.write_table(table, root / f"part-{part}.parquet", row_group_size=250)


def loader_of(root: Path, workers: int) -> tdu.TabularDataLoader:
    return tdu.create_dataloader(str(root), batch_size=64, shuffle=True, num_workers=workers)


def train(
    loader: tdu.TabularDataLoader, epoch: int, model: torch.nn.Module, steps: int | None = None
) -> tuple[list[float], list[int]]:
    """``steps`` steps of an epoch (None: the rest of it); each step's loss, the row ids read."""
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    losses: list[float] = []
    seen: list[int] = []
    loader.set_epoch(epoch)
    for step, batch in enumerate(loader):
        loss = torch.nn.functional.mse_loss(model(batch["x"][:, None])[:, 0], batch["y"])
        optimizer.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)  # (a spike stays one step)
        optimizer.step()
        losses.append(loss.item())
        seen += batch["id"].tolist()
        if steps is not None and step + 1 == steps:
            break
    return losses, seen


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args()
    torch.manual_seed(0)
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        write(root)
        loader = loader_of(root, args.workers)
        losses, _ = train(loader, 0, torch.nn.Linear(1, 1))
        spikes = [s for s, loss in enumerate(losses) if loss > 100 * np.median(losses)]
        print(f"epoch 0: {len(losses)} steps, loss spikes at steps {spikes}")
        for step in spikes:  # what the model saw there, from the plan alone
            rows = loader.rows_at(step, epoch=0)
            bad = rows.filter(pa.compute.greater(rows.column("y"), 100))
            for row in bad.select(["__file__", "__row__", "id", "y"]).to_pylist():
                print(f"  step {step}: {row}")
        assert {i for s in spikes for i in loader.rows_at(s, epoch=0)["id"].to_pylist()} >= set(
            BAD
        ), "the spikes hold the corrupted rows"
        # Run epoch 0 again, skipping those steps, and restart from a checkpoint mid-way.
        loader = loader_of(root, args.workers)
        for step in spikes:
            loader.skip(epoch=0, batches=range(step, step + 1))
        model = torch.nn.Linear(1, 1)
        first, seen = train(loader, 0, model, steps=len(losses) // 2)
        state = loader.state_dict()  # (saved with the model, in a real run)
        resumed = loader_of(root, args.workers)  # (a new process, in a real run)
        resumed.load_state_dict(state)
        rest, more = train(resumed, 0, model)
        read = Counter(seen + more)
        skipped = {i for s in spikes for i in loader.rows_at(s, epoch=0)["id"].to_pylist()}
        assert max(first + rest) < 100, "no spike once the batches are skipped"
        assert set(read) == set(range(ROWS)) - skipped and max(read.values()) == 1
        print(
            f"again, skipping {len(spikes)} steps and resumed after {len(first)}: "
            f"{len(first) + len(rest)} steps, max loss {max(first + rest):.3f}, "
            f"{len(read)} rows once, the {len(skipped)} skipped rows never"
        )


if __name__ == "__main__":
    main()
