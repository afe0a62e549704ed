"""Kill a job in the middle of an epoch, then resume it in a new job (maybe another topology).

Spec ``mode: "kill"``: ``data``, ``out``, ``states`` (a folder), ``epoch``, ``cases``: a list of
``{name, num_workers, k}``, and, for packed sequences, ``packed`` (the data of the cases
named ``*p``, read with ``packing``'s keywords and ``packed_batch``). Each case reads ``k``
batches per rank of ``epoch`` and rank 0 saves its ``state_dict()`` to ``states/NAME.pt`` with
``torch.save``. After the LAST case, rank 0 writes the result and dies with ``os._exit(3)``
while its DataLoader workers are busy and the other ranks are in a collective, as a crashed
node would: the launch exits non-zero.

Spec ``mode: "resume"``: ``data``, ``out``, ``cases``: a list of ``{name, state, num_workers}``
(``packed`` and the rest as for ``kill``). Each case builds a fresh loader, loads the state on
every rank and reads the rest of the epoch (``after``), then the next epoch (``next``). A second
fresh loader that never saw a state reads both epochs whole (``reference``,
``reference_next``): an uninterrupted run on this topology.
"""

from __future__ import annotations

import os
from itertools import islice
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

import torch_dataloader_utils as tdu
from tests.distributed.scripts.ranks import (
    gather,
    ids,
    join,
    leave,
    packing_of,
    spec,
    watchdog,
    write,
)


def build(job: dict[str, Any], case: dict[str, Any], num_workers: int) -> tdu.TabularDataLoader:
    """The loader of ``case`` (a packed one when its name ends in ``p``)."""
    extra: dict[str, Any] = {
        "multiprocessing_context": "fork",
        "timeout": 60,
        "worker_init_fn": watchdog,
    }
    data, options = job["data"], {"batch_size": job["batch_size"]}
    if case["name"].split("->")[0].endswith("p"):
        data = job["packed"]
        options = {"batch_size": job["packed_batch"], "packing": packing_of(job["packing"])}
    return tdu.create_dataloader(
        data,
        shuffle=True,
        num_workers=num_workers,
        **options,
        **(extra if num_workers else {}),
    )


def kill(job: dict[str, Any]) -> None:
    rank, _ = join()
    results: dict[str, Any] = {}
    cases = job["cases"]
    for position, case in enumerate(cases):
        loader = build(job, case, case["num_workers"])
        loader.set_epoch(job["epoch"])
        batches = iter(loader)
        before = ids(islice(batches, case["k"]))
        state = loader.state_dict()
        if rank == 0:
            partial = Path(job["states"], f"{case['name']}.partial")
            torch.save(state, partial)
            partial.replace(partial.with_suffix(".pt"))
        results[case["name"]] = gather({"before": before, "state": state})
        if position < len(cases) - 1:
            del batches  # abandoned in the middle of the epoch: its workers stop
            continue
        write(job["out"], results)
        dist.barrier()  # the result and every state are on disk
        if rank == 0:
            os._exit(3)  # a crash: no cleanup, workers and peers left behind
        # The other ranks train on: the next collective never completes.
        for _ in batches:
            dist.all_reduce(torch.ones(1))
        dist.barrier()


def resume(job: dict[str, Any]) -> None:
    join()
    results: dict[str, Any] = {}
    for case in job["cases"]:
        state = torch.load(case["state"], weights_only=True)
        epoch = state["epoch"]
        loader = build(job, case, case["num_workers"])
        loader.load_state_dict(state)
        loader.set_epoch(epoch)  # as a training loop does; the loaded state is kept
        after = ids(loader)
        loader.set_epoch(epoch + 1)
        following = ids(loader)
        fresh = build(job, case, case["num_workers"])
        fresh.set_epoch(epoch)
        reference = ids(fresh)
        fresh.set_epoch(epoch + 1)
        reference_next = ids(fresh)
        results[case["name"]] = gather(
            {
                "after": after,
                "next": following,
                "reference": reference,
                "reference_next": reference_next,
            }
        )
    write(job["out"], results)
    leave()


def main() -> None:
    job = spec()
    {"kill": kill, "resume": resume}[job["mode"]](job)


if __name__ == "__main__":
    main()
