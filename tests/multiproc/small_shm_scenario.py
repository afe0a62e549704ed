"""Loaders in a small ``/dev/shm``, run as ``python -m tests.multiproc.small_shm_scenario
SPEC_JSON`` inside a private mount namespace (`test_small_shm.py` mounts the tmpfs); prints one
JSON line per run.

Spec: ``data`` (a directory of Parquet files with an ``id`` column), ``rows`` (ids 0..rows-1),
``runs``: a list of ``[workers, batch_size, context, collate]``.

Result per run: ``workers``, ``batch_size``, ``context``, ``collate``, ``ids_ok`` (every id
exactly once), ``batches``, or ``error`` (class and message); ``left_in_shm``: torch's files
left in /dev/shm after the run.
"""

from __future__ import annotations

import json
import logging
import os
import sys
from collections import Counter
from typing import Any

import torch

import torch_dataloader_utils as tdu


def _collate(batch: dict[str, Any]) -> dict[str, Any]:
    """A user's collate_fn: tensors torch itself sends through /dev/shm."""
    return {"id": batch["id"].clone(), "embedding": batch["embedding"] * 1.0}


def run(spec: dict[str, Any], workers: int, batch_size: int, context: str, collate: bool) -> Any:
    out: dict[str, Any] = {
        "workers": workers,
        "batch_size": batch_size,
        "context": context,
        "collate": collate,
        "shm": os.statvfs("/dev/shm").f_blocks * os.statvfs("/dev/shm").f_frsize,
    }
    try:
        loader = tdu.create_dataloader(
            spec["data"],
            batch_size=batch_size,
            shuffle=True,
            num_workers=workers,
            multiprocessing_context=context,
            collate_fn=_collate if collate else None,
            timeout=120,
        )
        seen: Counter[int] = Counter()
        batches = 0
        for batch in loader:
            seen.update(batch["id"].tolist())
            if collate:
                assert isinstance(batch["embedding"], torch.Tensor)
            batches += 1
        out["ids_ok"] = seen == Counter(range(spec["rows"]))
        out["batches"] = batches
    except Exception as exc:
        out["error"] = f"{type(exc).__name__}: {exc}"[:2000]
    # torch's shared memory files left behind (a failed allocation leaves its file).
    out["left_in_shm"] = sorted(n for n in os.listdir("/dev/shm") if n.startswith("torch_"))
    return out


def main() -> None:
    spec = json.loads(sys.argv[1])
    logging.basicConfig(level=logging.WARNING, format="LOG %(process)d %(name)s: %(message)s")
    logging.getLogger("torch_dataloader_utils.transport").setLevel(logging.INFO)
    for workers, batch_size, context, collate in spec["runs"]:
        print(json.dumps(run(spec, workers, batch_size, context, collate)), flush=True)


if __name__ == "__main__":
    main()
