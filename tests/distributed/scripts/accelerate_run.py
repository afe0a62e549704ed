"""Train with HF Accelerate (CPU, gloo, under torchrun) on a loader passed through prepare().

Spec: ``data``, ``out``, ``checkpoint`` (a folder), ``batch_size``, ``k``, ``packing`` (a
``tdu.Packing``'s keywords, or none: rows), ``mode``:

- ``"save"``: the default ``DataLoaderConfiguration()``. Epochs 0 and 1 whole; in epoch 2,
  ``accelerator.save_state(checkpoint)`` after ``k`` batches, then the rest of the epoch.
- ``"load"``: ``DataLoaderConfiguration(dispatch_batches=False, use_stateful_dataloader=True)``
  and ``gradient_accumulation_steps=3``. Epochs 0 and 1 whole inside
  ``accelerator.accumulate`` (recording ``sync_gradients`` at every batch); then
  ``accelerator.load_state(checkpoint)`` and the rest of epoch 2.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from accelerate import Accelerator, DataLoaderConfiguration
from torch import nn

import torch_dataloader_utils as tdu
from tests.distributed.scripts.ranks import (
    batch_ids,
    gather,
    leave,
    packing_of,
    spec,
    watchdog,
    write,
)

ACCUMULATE = 3


def step(accelerator: Accelerator, model: nn.Module, optimizer: Any, batch: Any) -> None:
    if "input_ids" in batch:  # packed sequences: each token's value mod 7 is its feature
        x = (batch["input_ids"].clamp(min=0) % 7).float().reshape(-1)
        target = torch.zeros_like(x)
    else:
        x, target = batch["x"], batch["label"].float()
    prediction = model(x[:, None])
    loss = nn.functional.mse_loss(prediction[:, 0], target)
    accelerator.backward(loss)
    optimizer.step()
    optimizer.zero_grad()


def run(job: dict[str, Any]) -> dict[str, Any]:
    """This rank's result (see the module docstring)."""
    saving = job["mode"] == "save"
    if saving:
        config = DataLoaderConfiguration()
        accelerator = Accelerator(cpu=True, dataloader_config=config)
    else:
        config = DataLoaderConfiguration(dispatch_batches=False, use_stateful_dataloader=True)
        accelerator = Accelerator(
            cpu=True, dataloader_config=config, gradient_accumulation_steps=ACCUMULATE
        )
    torch.manual_seed(0)
    model = nn.Linear(1, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-4)
    built = tdu.create_dataloader(
        job["data"],
        batch_size=job["batch_size"],
        shuffle=True,
        num_workers=2,
        multiprocessing_context="fork",
        timeout=60,
        worker_init_fn=watchdog,  # (a worker stuck past 45 s prints its stacks: seen twice)
        accelerator=accelerator,
        packing=packing_of(job.get("packing")),
    )
    model, optimizer, loader = accelerator.prepare(model, optimizer, built)
    result: dict[str, Any] = {
        "process_index": accelerator.process_index,
        "num_processes": accelerator.num_processes,
        "distributed_type": str(accelerator.distributed_type),
        "dist_rank": dist.get_rank(),
        "unchanged": loader is built,
        "epochs": [],
        "sync": [],
    }
    for epoch in range(2):
        loader.set_epoch(epoch)
        ids, sync = [], []
        for batch in loader:
            ids.append(batch_ids(batch))
            if saving:
                step(accelerator, model, optimizer, batch)
            else:
                with accelerator.accumulate(model):
                    step(accelerator, model, optimizer, batch)
                    sync.append(accelerator.sync_gradients)
        result["epochs"].append(ids)
        result["sync"].append(sync)
    loader.set_epoch(2)
    if saving:
        before, rest = [], []
        for batch in loader:
            (before if len(before) < job["k"] else rest).append(batch_ids(batch))
            step(accelerator, model, optimizer, batch)
            if len(before) == job["k"] and not rest:
                accelerator.save_state(job["checkpoint"])
        result.update(before=before, rest=rest)
    else:
        accelerator.load_state(job["checkpoint"])
        loader.set_epoch(2)  # as a training loop does; the loaded state is kept
        result["rest"] = [batch_ids(batch) for batch in loader]
    return result


def main() -> None:
    job = spec()
    result = run(job)  # its DDP model, which holds the process group, is gone on return
    write(job["out"], gather(result))
    leave()


if __name__ == "__main__":
    main()
