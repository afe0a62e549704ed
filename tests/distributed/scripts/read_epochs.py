"""Read whole epochs on every rank, for several loader configurations in one launch.

Spec: ``data``, ``out``, ``cases``: a list of ``{name, num_workers, epochs, remainder, filter,
persistent, data, format, format_options, on_error, packing}`` (a case's ``data`` overrides the
spec's; ``packing``: a ``tdu.Packing``'s keywords, the ids of a batch its tokens). For each
case and rank the result holds the ids of every batch of every epoch, the rows each skipped read
replaced, ``len(loader)``, the plan fingerprint, and how often this rank listed files, counted
filtered rows and counted tokens while building the loader: planning is meant to happen on rank
0 alone.
"""

from __future__ import annotations

import functools
from collections import Counter
from collections.abc import Callable
from typing import Any

import torch_dataloader_utils as tdu
import torch_dataloader_utils.sources.files as planner_module
import torch_dataloader_utils.sources.prepare as lister_module
from tests.distributed.scripts.ranks import (
    FILTERS,
    gather,
    ids,
    join,
    leave,
    packing_of,
    spec,
    write,
)

# Count the planning calls of this process. They are the library's own functions, wrapped
# where the dataset module looks them up: storage is still listed and read for real.
CALLS: Counter[str] = Counter()


def counted(name: str, function: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(function)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        CALLS[name] += 1
        return function(*args, **kwargs)

    return wrapper


lister_module.list_files = counted("list_files", lister_module.list_files)  # type: ignore[assignment]
planner_module.count_rows = counted("count_rows", planner_module.count_rows)  # type: ignore[assignment]
planner_module.count_tokens = counted("count_tokens", planner_module.count_tokens)  # type: ignore[assignment]


PLANNING = ("list_files", "count_rows", "count_tokens")


def read_case(data: str, case: dict[str, Any]) -> dict[str, Any]:
    before = CALLS.copy()
    workers = case.get("num_workers", 0)
    options: dict[str, Any] = {}
    if workers:
        options.update(
            multiprocessing_context="fork",
            persistent_workers=case.get("persistent", False),
            timeout=60,
        )
    loader = tdu.create_dataloader(
        case.get("data", data),
        format=case.get("format", "parquet"),
        format_options=case.get("format_options"),
        batch_size=case["batch_size"],
        shuffle=True,
        shuffle_seed=3,
        num_workers=workers,
        remainder=case.get("remainder", "drop"),
        filters=FILTERS[case["filter"]] if case.get("filter") else None,
        on_error=case.get("on_error", "raise"),
        packing=packing_of(case.get("packing")),
        **options,
    )
    planning = {name: CALLS[name] - before[name] for name in PLANNING}
    epochs = []
    for epoch in range(case.get("epochs", 1)):
        loader.set_epoch(epoch)
        epochs.append(ids(loader))
    return {
        "epochs": epochs,
        "failures": [f.skipped for f in loader.read_failures],
        "len": len(loader),
        "fingerprint": loader.dataset.plan.fingerprint,
        **planning,
    }


def main() -> None:
    job = spec()
    join()
    results = {case["name"]: gather(read_case(job["data"], case)) for case in job["cases"]}
    write(job["out"], results)
    leave()


if __name__ == "__main__":
    main()
