"""Read a mixture of three kinds of sources on every rank: Parquet on S3, local WebDataset
shards and an Iceberg table behind a REST catalog (``tests/remote/test_mixture_remote.py``).

Spec: ``config`` (a JSON file, written by the test, holding the sources: see `make_loader`;
it holds the storage credentials, which stay off the command line), ``out``, ``epochs``,
``num_workers``. For each rank the result holds the ids and source numbers of every batch of
every epoch, ``len(loader)``, the quotas and the plan fingerprint.

`make_loader` is also what the test builds its single-process loaders with, so the ranks and
the test read the same mixture.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch_dataloader_utils as tdu
from tests.distributed.scripts.ranks import gather, join, leave, spec, watchdog, write

COLUMNS = ["id", "cls", "txt"]  # what every source yields (each selects them with columns=)
BATCH = 40
SEED = 5


def sources(config: dict[str, Any]) -> list[tdu.Source]:
    """The three sources of ``config`` (``parquet`` + ``storage_options``, ``shards``,
    ``table`` + ``catalog_config``; ``weights``), in that order."""
    parquet, shards, table = config["weights"]
    return [
        tdu.Source(
            config["parquet"],
            weight=parquet,
            columns=COLUMNS,
            storage_options=config["storage_options"],
        ),
        tdu.Source(config["shards"], format="webdataset", weight=shards, columns=COLUMNS),
        tdu.Source(
            table=config["table"],
            catalog_config=config["catalog_config"],
            weight=table,
            columns=COLUMNS,
        ),
    ]


def make_loader(config: dict[str, Any], **options: Any) -> tdu.TabularDataLoader:
    """The mixture of ``config``: ``epoch_rows``, batches of `BATCH`, shuffled, a ``source``
    column; workers forked with a timeout, so a stuck worker fails instead of hanging."""
    options = {
        "epoch_rows": config["epoch_rows"],
        "batch_size": BATCH,
        "shuffle": True,
        "shuffle_seed": SEED,
        "source_column": "source",
        "num_workers": 0,
        **options,
    }
    if options["num_workers"]:
        options.setdefault("multiprocessing_context", "fork")
        options.setdefault("timeout", 60)
    return tdu.create_dataloader(sources(config), **options)


def read_epochs(loader: tdu.TabularDataLoader, epochs: int) -> list[list[dict[str, Any]]]:
    """Every batch of each epoch as ``{"id": [...], "source": [...]}`` (after checking that
    each row's other columns are those of its id)."""
    out = []
    for epoch in range(epochs):
        loader.set_epoch(epoch)
        batches = []
        for batch in loader:
            ids = batch["id"].tolist()
            assert batch["cls"].tolist() == [i % 7 for i in ids], ids
            assert list(batch["txt"]) == [f"row-{i}" for i in ids], ids
            batches.append({"id": ids, "source": batch["source"].tolist()})
        out.append(batches)
    return out


def main() -> None:
    job = spec()
    config = json.loads(Path(job["config"]).read_text())
    join()
    loader = make_loader(config, num_workers=job["num_workers"], worker_init_fn=watchdog)
    result = {
        "epochs": read_epochs(loader, job["epochs"]),
        "len": len(loader),
        "quotas": list(loader.dataset.quotas),
        "fingerprint": loader.dataset.plan.fingerprint,
    }
    write(job["out"], gather(result))
    leave()


if __name__ == "__main__":
    main()
