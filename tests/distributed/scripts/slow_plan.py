"""Planning on rank 0 that takes longer than the process group's timeout.

Spec: ``data``, ``out``, ``timeout`` (the process group's, seconds), ``sleep`` (seconds rank 0's
listing sleeps before listing for real), ``cases``: a list of ``{name, data, catch}`` (``data``
overrides the spec's: a missing path makes rank 0's planning fail after the sleep; ``catch``:
false lets an error end the rank). For each case and rank the result holds the plan
fingerprint and the ids of one shuffled epoch, or the error the rank got (its type and
message), how often the rank listed files, and the seconds it took to build the loader.

The group is made with ``timeout=`` the spec's: a rank waiting for rank 0 inside a collective
would fail with gloo's timeout; the planning broadcast must wait longer.
"""

from __future__ import annotations

import functools
import time
from collections import Counter
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import torch.distributed as dist

import torch_dataloader_utils as tdu
import torch_dataloader_utils.sources.prepare as planner_module
from tests.distributed.scripts.ranks import gather, ids, leave, spec, write

CALLS: Counter[str] = Counter()


def slow(function: Callable[..., Any], seconds: float) -> Callable[..., Any]:
    """``function`` after ``seconds`` of sleep (a slow listing of a large bucket)."""

    @functools.wraps(function)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        CALLS["list_files"] += 1
        time.sleep(seconds)
        return function(*args, **kwargs)

    return wrapper


def read_case(data: str, catch: bool) -> dict[str, Any]:
    before = CALLS["list_files"]
    start = time.monotonic()
    try:
        loader = tdu.create_dataloader(data, batch_size=16, shuffle=True, shuffle_seed=5)
    except Exception as exc:
        if not catch:
            raise
        return {
            "error": type(exc).__name__,
            "message": str(exc),
            "list_files": CALLS["list_files"] - before,
            "seconds": time.monotonic() - start,
        }
    seconds = time.monotonic() - start
    return {
        "fingerprint": loader.dataset.plan.fingerprint,
        "ids": ids(loader),
        "list_files": CALLS["list_files"] - before,
        "seconds": seconds,
    }


def main() -> None:
    job = spec()
    dist.init_process_group("gloo", timeout=timedelta(seconds=job["timeout"]))
    rank = dist.get_rank()
    sleep = job["sleep"] if rank == 0 else 0.0
    planner_module.list_files = slow(planner_module.list_files, sleep)  # type: ignore[assignment]
    results = {}
    for case in job["cases"]:
        result = read_case(case.get("data", job["data"]), case.get("catch", True))
        results[case["name"]] = gather(result)
    write(job["out"], results)
    leave()


if __name__ == "__main__":
    main()
