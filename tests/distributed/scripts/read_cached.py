"""Read epochs of remote data on every rank through one node-local cache.

Spec: ``config`` (a JSON file written by the test: ``url``, ``storage_options``), ``cache_dir``,
``epochs``, ``batch_size``, ``num_workers``, ``out``. Every rank reads with forked DataLoader
workers; the result holds, per rank, the ids of each epoch's batches and what the cache did in
each epoch (`TabularDataLoader.cache_epochs`).
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import torch_dataloader_utils as tdu
from tests.distributed.scripts.ranks import gather, ids, join, leave, spec, write


def main() -> None:
    job = spec()
    join()
    with open(job["config"]) as f:
        config = json.load(f)
    loader = tdu.create_dataloader(
        config["url"],
        storage_options=config["storage_options"],
        batch_size=job["batch_size"],
        shuffle=True,
        num_workers=job["num_workers"],
        multiprocessing_context="fork",
        timeout=60,
        cache_dir=job["cache_dir"],
    )
    epochs = []
    for epoch in range(job["epochs"]):
        loader.set_epoch(epoch)
        epochs.append(ids(loader))
    result: dict[str, Any] = {
        "epochs": epochs,
        "cache": {e: dataclasses.asdict(s) for e, s in loader.cache_epochs.items()},
        "planning": dataclasses.asdict(loader.cache_stats - sum_epochs(loader)),
    }
    write(job["out"], gather(result))
    leave()


def sum_epochs(loader: Any) -> tdu.CacheStats:
    total = tdu.CacheStats()
    for stats in loader.cache_epochs.values():
        total = total + stats
    return total


if __name__ == "__main__":
    main()
