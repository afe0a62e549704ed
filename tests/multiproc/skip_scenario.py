"""One ``on_error`` scenario, run as ``python -m tests.multiproc.skip_scenario SPEC_JSON`` in a
process of its own (a crash or a hang fails one test, not the suite); prints a JSON result.

Spec: ``data`` (a directory), ``format``, ``format_options``, ``on_error``, ``workers``,
``context`` (``fork``/``spawn``), ``shuffle``, ``batch_size``, ``output_format``,
``delete_after_planning`` (a path), ``resume_after`` (batches read before a state is taken and
loaded into a new loader, which reads the rest).

Result: ``ids`` (every id delivered, in order), ``batches``, ``failures`` (``loader.
read_failures`` as dicts), ``state`` (the final ``state_dict()["read_failures"]``), or
``error`` (the class and message raised).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import sys
from typing import Any

import torch_dataloader_utils as tdu


def _loader(spec: dict[str, Any]) -> Any:
    workers = spec.get("workers", 0)
    return tdu.create_dataloader(
        spec["data"],
        format=spec.get("format", "parquet"),
        format_options=spec.get("format_options"),
        batch_size=spec.get("batch_size", 16),
        shuffle=spec.get("shuffle", True),
        shuffle_seed=5,
        num_workers=workers,
        multiprocessing_context=spec.get("context", "fork") if workers else None,
        on_error=spec.get("on_error", "raise"),
        output_format=spec.get("output_format", "torch"),
        timeout=60 if workers else 0,
    )


def _ids(batch: Any) -> list[int]:
    values = batch["id"]
    return [int(v) for v in (values.tolist() if hasattr(values, "tolist") else values)]


def run(spec: dict[str, Any]) -> dict[str, Any]:
    loader = _loader(spec)
    gone = spec.get("delete_after_planning")
    if gone:
        os.remove(gone)
    ids: list[int] = []
    batches = 0
    try:
        resume_after = spec.get("resume_after")
        for batch in loader:
            ids += _ids(batch)
            batches += 1
            if batches == resume_after:
                break
        if resume_after is not None:
            state = loader.state_dict()
            loader = _loader(spec)
            loader.load_state_dict(state)
            for batch in loader:
                ids += _ids(batch)
                batches += 1
    except tdu.TorchDataloaderUtilsError as exc:
        return {"error": {"type": type(exc).__name__, "message": str(exc)}, "ids": ids}
    return {
        "ids": ids,
        "batches": batches,
        "len": len(loader),
        "failures": [dataclasses.asdict(f) for f in loader.read_failures],
        "state": loader.state_dict().get("read_failures"),
    }


if __name__ == "__main__":
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    sys.stdout.write(json.dumps(run(json.loads(sys.argv[1]))) + "\n")
