"""States cross between one process and torchrun ranks over fixed-size lists and maps.

Spec: ``data``, ``out``, ``batch_size``, ``seed``, ``resume`` (a state one process saved with
``torch.save``: every rank loads it and reads the rest of its epoch, ``after``), ``save`` and
``k`` (a fresh loader reads ``k`` batches a rank, ``before``, and rank 0 saves its state
there). Every batch's values are checked against its ids (`tests.nested_data.check_batch`).
Each rank's result also holds its plan's fingerprint and schema.
"""

from __future__ import annotations

from itertools import islice
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

import torch_dataloader_utils as tdu
from tests.distributed.scripts.ranks import gather, join, leave, spec, write
from tests.nested_data import check_batch


def build(job: dict[str, Any]) -> tdu.TabularDataLoader:
    return tdu.create_dataloader(
        job["data"], batch_size=job["batch_size"], shuffle=True, shuffle_seed=job["seed"]
    )


def read(loader: tdu.TabularDataLoader, count: int | None = None) -> list[int]:
    return [i for batch in islice(loader, count) for i in check_batch(batch)]


def main() -> None:
    job = spec()
    rank, _ = join()
    resumed = build(job)
    resumed.load_state_dict(torch.load(job["resume"], weights_only=True))
    after = read(resumed)
    saver = build(job)
    before = read(saver, job["k"])
    if rank == 0:
        partial = Path(job["save"]).with_suffix(".partial")
        torch.save(saver.state_dict(), partial)
        partial.replace(job["save"])
    plan = resumed.dataset.plan
    result = {
        "fingerprint": plan.fingerprint,
        "schema": plan.schema.to_string(),
        "after": after,
        "before": before,
    }
    dist.barrier()  # the state is on disk
    write(job["out"], gather(result))
    leave()


if __name__ == "__main__":
    main()
