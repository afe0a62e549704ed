"""Planning spread over the ranks, and plans kept in ``cache_dir`` for a restart.

Spec: ``out``, ``cases``: a list of ``{name, data, format, cache_dir, change}`` read in order
(``change``: before this case, rank 0 rewrites that file of ``data`` with the same rows, a new
modification time, so its identity changes). For each case and rank the result holds the plan's
fingerprint, the files whose facts (footers) this rank read, the files whose schema it read,
how many format plans it made, and the ids of one shuffled epoch.
"""

from __future__ import annotations

import functools
import os
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

import pyarrow.compute as pc
import pyarrow.parquet as pq
import torch.distributed as dist

import torch_dataloader_utils as tdu
import torch_dataloader_utils.sources.files as files_module
from tests.distributed.scripts.ranks import gather, ids, join, leave, spec, write
from torch_dataloader_utils.formats import get_format

CALLS: Counter[str] = Counter()
READ: list[str] = []


def counting(name: str, method: Callable[..., Any]) -> Callable[..., Any]:
    """``method``, counting the files it is given (facts), or its calls."""

    @functools.wraps(method)
    def wrapper(self: Any, *args: Any, **kwargs: Any) -> Any:
        if name == "facts":
            READ.extend(os.path.basename(f.path) for f in args[0].files)
        CALLS[name] += 1
        return method(self, *args, **kwargs)

    return wrapper


def patch_counting() -> None:
    """Count the chunks whose passing rows or lengths this rank counts."""
    for name in ("count_rows", "count_lengths"):
        method = getattr(files_module, name)

        def counted(chunks: Any, *args: Any, _method: Any = method, **kwargs: Any) -> Any:
            CALLS["counted"] += len(chunks)
            return _method(chunks, *args, **kwargs)

        setattr(files_module, name, counted)


def patch_formats() -> None:
    """Count, in every format class, what planning reads of files."""
    classes = [type(get_format(n)) for n in ("parquet", "orc", "ipc", "csv")]
    for cls in classes:
        for name in ("facts", "schema", "plan"):
            setattr(cls, name, counting(name, getattr(cls, name)))


def rewrite(path: str) -> None:
    """The same rows, another modification time (a new identity)."""
    pq.write_table(pq.read_table(path), path)
    later = time.time() + 10
    os.utime(path, (later, later))


def main() -> None:
    job = spec()
    rank, _ = join()
    patch_formats()
    patch_counting()
    results = {}
    for case in job["cases"]:
        if case.get("change") and rank == 0:
            rewrite(os.path.join(case["data"], case["change"]))
        dist.barrier()
        READ.clear()
        CALLS.clear()
        options: dict[str, Any] = {}
        if case.get("filter"):  # rows with x below this
            options["filters"] = pc.field("x") < case["filter"]
        if case.get("budget"):  # token-budget batches over the "tokens" lists
            options["batching"] = tdu.TokenBudget("tokens", max_tokens=case["budget"])
        else:
            options["batch_size"] = 16
        loader = tdu.create_dataloader(
            case["data"],
            format=case.get("format", "parquet"),
            shuffle=True,
            cache_dir=case.get("cache_dir"),
            **options,
        )
        result = {
            "fingerprint": loader.dataset.plan.fingerprint,
            "facts": sorted(READ),
            "schema": CALLS["schema"],
            "plans": CALLS["plan"],
            "counted": CALLS["counted"],
            "ids": ids(loader),
        }
        results[case["name"]] = gather(result)
    write(job["out"], results)
    leave()


if __name__ == "__main__":
    main()
