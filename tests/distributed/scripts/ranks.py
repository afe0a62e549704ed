"""The rank side of a launch: join the group, gather results, rank 0 writes them.

Scripts in this folder run under torchrun (see ``tests/distributed/conftest.py``); they take one
argument, ``--spec JSON``, whose ``out`` is the file rank 0 writes.
"""

from __future__ import annotations

import argparse
import faulthandler
import json
import os
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pyarrow.compute as pc
import torch.distributed as dist

import torch_dataloader_utils as tdu

# Row filters by name (a spec is JSON): rows with label (= id % 7) below 3, from id 100 on. The
# id bound prunes row groups at plan time; the label test removes rows inside the others.
FILTERS = {"label<3,id>=100": (pc.field("label") < 3) & (pc.field("id") >= 100)}


def spec() -> dict[str, Any]:
    """The ``--spec`` this script was launched with."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--spec", required=True)
    return dict(json.loads(parser.parse_args().spec))


def join() -> tuple[int, int]:
    """Join the gloo group torchrun describes; return ``(rank, world_size)``."""
    dist.init_process_group("gloo")
    return dist.get_rank(), dist.get_world_size()


def gather(value: Any) -> list[Any]:
    """``value`` of every rank, in rank order."""
    values: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(values, value)
    return values


def write(path: str | os.PathLike[str], value: Any) -> None:
    """Rank 0 writes ``value`` as JSON (whole or not at all); the other ranks do nothing."""
    if dist.get_rank() != 0:
        return
    target = Path(path)
    partial = target.with_suffix(".partial")
    partial.write_text(json.dumps(value))
    partial.replace(target)


def leave() -> None:
    """Wait for every rank, leave the group, and exit without the interpreter's teardown.

    The results are written and every rank got here, so the job has done what it is tested
    for. Torch's teardown of gloo threads at interpreter exit aborted now and then ("terminate
    called without an active exception", seen under load): exiting here keeps that teardown,
    which is not this library's, from failing a test. A rank that raised never gets here and
    still fails the launch.
    """
    dist.barrier()
    dist.destroy_process_group()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def watchdog(worker_id: int) -> None:
    """A DataLoader ``worker_init_fn``: a worker still alive after 45 s prints every thread's
    stack to the launch's output (test epochs take a second or two), so a stuck worker, seen
    once as a 60 s DataLoader timeout in a full suite run, can be diagnosed next time."""
    faulthandler.dump_traceback_later(45, exit=False)


def ids(batches: Iterable[dict[str, Any]]) -> list[list[int]]:
    """The ids of each batch (of a packed batch: its tokens, pads left out)."""
    return [batch_ids(batch) for batch in batches]


def batch_ids(batch: dict[str, Any]) -> list[int]:
    """The ids of a batch; a packed batch's tokens (non-negative ids), pads left out."""
    if "input_ids" in batch:
        tokens = batch["input_ids"]
        return [int(t) for t in tokens[tokens >= 0].tolist()]
    return [int(i) for i in batch["id"].tolist()]


def packing_of(spec: dict[str, Any] | None) -> tdu.Packing | None:
    """The `tdu.Packing` of a spec's ``packing`` (its keywords; ``balance``'s, a
    `tdu.Balance`'s), or ``None``."""
    if not spec:
        return None
    if spec.get("balance"):
        spec = {**spec, "balance": tdu.Balance(**spec["balance"])}
    return tdu.Packing(**spec)
