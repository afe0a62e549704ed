"""A mixture of three kinds of sources read for real: Parquet files on S3 (SeaweedFS), local
WebDataset shards, and an Iceberg table behind SeaweedFS's REST catalog (its data on S3).

Each source's ids have their own range, so the ids say which source a row came from, and every
row's other columns are functions of its id. Checked with 2 DataLoader workers (fork) in one
process, and under torchrun with 2 ranks (gloo): each epoch holds each source's quota, rows
come once before twice over the epochs, the source column agrees with the ids, and the ranks
together read the single-process epoch.
"""

from __future__ import annotations

import json
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

pytest.importorskip("pyiceberg")

from pyiceberg.catalog import Catalog, load_catalog
from pyiceberg.exceptions import NoSuchNamespaceError

import torch_dataloader_utils as tdu
from tests.distributed.conftest import run_script
from tests.distributed.scripts.read_mixture import BATCH, COLUMNS, make_loader, read_epochs
from tests.services.seaweedfs import SeaweedFS

from .conftest import MakeProxy

pytestmark = [
    pytest.mark.remote,
    pytest.mark.timeout(240),
    pytest.mark.filterwarnings("ignore:This DataLoader will create:UserWarning"),
]

BUCKET = "tdu-mixture"
# (first id, rows) of each source, in the order of the mixture's sources.
PARQUET = (0, 1000)  # on S3, three files with row groups of different sizes
SHARDS = (100_000, 250)  # local WebDataset shards of 70 samples
TABLE = (200_000, 500)  # an Iceberg table of two data files (two appends)
RANGES = (PARQUET, SHARDS, TABLE)
WEIGHTS = (3, 2, 1)
EPOCH_ROWS = 1200  # divisible by 2 ranks x BATCH: no rank drops a row
# Parquet is subsampled (600 of 1,000 rows an epoch, so epoch 1 goes on where epoch 0 stopped);
# the shards repeat (400 rows of 250); the table is subsampled (200 of 500).
QUOTAS = (600, 400, 200)
EPOCHS = 2


def rows(first: int, count: int) -> pa.Table:
    """Rows ``first .. first+count-1``: ``cls`` = id % 7, ``txt`` = "row-<id>", and a column
    ``y`` that the sources do not select."""
    ids = np.arange(first, first + count, dtype=np.int64)
    return pa.table(
        {
            "id": pa.array(ids),
            "cls": pa.array(ids % 7),
            "txt": pa.array([f"row-{i}" for i in ids], pa.string()),
            "y": pa.array(ids * 0.5),
        }
    )


def source_of(i: int) -> int:
    """The source whose id range holds ``i``."""
    return next(s for s, (first, n) in enumerate(RANGES) if first <= i < first + n)


# --- the sources -------------------------------------------------------------------------------


def _upload_parquet(server: SeaweedFS, local: Path) -> str:
    """PARQUET's rows in three files (row groups of 64, 100 and 30), uploaded to S3."""
    first, count = PARQUET
    folder = local / "parquet"
    folder.mkdir()
    bounds = [first, first + 400, first + 750, first + count]
    for i, (start, end, group) in enumerate(zip(bounds, bounds[1:], (64, 100, 30), strict=False)):
        pq.write_table(rows(start, end - start), folder / f"part-{i}.parquet", row_group_size=group)
    server.create_bucket(BUCKET)
    fs = server.filesystem()
    for path in sorted(folder.iterdir()):
        fs.put_file(str(path), f"{BUCKET}/parquet/{path.name}")
    fs.invalidate_cache()
    return f"s3://{BUCKET}/parquet"


def _write_shards(local: Path) -> str:
    """SHARDS's rows as WebDataset samples (``id``, ``cls``, ``txt`` and an unselected ``bin``),
    70 to a shard, each shard with its index."""
    first, count = SHARDS
    folder = local / "shards"
    with tdu.ShardWriter(str(folder / "mix-%03d.tar"), maxcount=70) as sink:
        for i in range(first, first + count):
            sample = {"__key__": f"s{i}", "id": i, "cls": i % 7, "txt": f"row-{i}"}
            sink.write({**sample, "bin": bytes([i % 256]) * (i % 50)})
    assert len(sink.shards) == 4
    return str(folder)


def _rest_catalog(config: dict[str, str], *, wait: float = 20.0) -> Catalog:
    """The REST catalog of ``config``, polled (bounded) until it lists namespaces: SeaweedFS
    creates its table bucket a moment after it answers."""
    properties = {k: v for k, v in config.items() if k != "name"}
    deadline = time.monotonic() + wait
    while True:
        try:
            catalog = load_catalog(config["name"], **properties)
            catalog.list_namespaces()
            return catalog
        except NoSuchNamespaceError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.25)


def _create_table(config: dict[str, str]) -> str:
    """TABLE's rows in ``ns_<random>.mix``, appended in two data files (row groups of 100)."""
    catalog = _rest_catalog(config)
    namespace = f"ns_{uuid.uuid4().hex[:8]}"
    catalog.create_namespace(namespace)
    name = f"{namespace}.mix"
    first, count = TABLE
    table = catalog.create_table(
        name, schema=rows(0, 0).schema, properties={"write.parquet.row-group-limit": "100"}
    )
    table.append(rows(first, 300))
    table.append(rows(first + 300, count - 300))
    return name


@pytest.fixture(scope="module")
def mixture(seaweedfs: SeaweedFS, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The mixture's sources (what `read_mixture.make_loader` takes)."""
    local = tmp_path_factory.mktemp("mixture-remote")
    catalog_config = {"name": "tdu_mix", **seaweedfs.iceberg_rest_properties()}
    return {
        "parquet": _upload_parquet(seaweedfs, local),
        "storage_options": seaweedfs.s3fs_options(),
        "shards": _write_shards(local),
        "table": _create_table(catalog_config),
        "catalog_config": catalog_config,
        "weights": list(WEIGHTS),
        "epoch_rows": EPOCH_ROWS,
    }


@pytest.fixture(scope="module")
def reference(mixture: dict[str, Any]) -> list[list[dict[str, Any]]]:
    """Every batch of each epoch, read in this process without workers."""
    loader = make_loader(mixture)
    assert loader.dataset.quotas == QUOTAS
    return read_epochs(loader, EPOCHS)


# --- checks ------------------------------------------------------------------------------------


def _ids(batches: list[dict[str, Any]]) -> list[int]:
    return [i for batch in batches for i in batch["id"]]


def assert_quotas_and_once_before_twice(epochs: list[list[dict[str, Any]]]) -> None:
    """Each epoch holds each source's quota, the source column agrees with the ids, and after
    each epoch every row of a source has been read floor or ceil of (delivered / rows) times."""
    seen: Counter[int] = Counter()
    for epoch, batches in enumerate(epochs):
        for batch in batches:
            assert batch["source"] == [source_of(i) for i in batch["id"]]
        got = _ids(batches)
        per_source = Counter(source_of(i) for i in got)
        assert tuple(per_source[s] for s in range(len(RANGES))) == QUOTAS, f"epoch {epoch}"
        seen.update(got)
        for quota, (first, count) in zip(QUOTAS, RANGES, strict=True):
            low, extra = divmod((epoch + 1) * quota, count)
            counts = Counter(seen[i] for i in range(first, first + count))
            expected = {low + 1: extra, low: count - extra} if extra else {low: count}
            assert counts == Counter(expected), f"epoch {epoch}, ids from {first}"


# --- tests -------------------------------------------------------------------------------------


def test_one_process_without_workers(reference: list[list[dict[str, Any]]]) -> None:
    assert_quotas_and_once_before_twice(reference)
    assert all(len(batches) == EPOCH_ROWS // BATCH for batches in reference)
    first, second = (_ids(batches) for batches in reference)
    assert first != second  # set_epoch orders each epoch


@pytest.mark.parametrize("mixing", ["random", "stratified"])
def test_two_workers_each_epoch_holds_each_quota_and_rows_come_once_before_twice(
    mixture: dict[str, Any], reference: list[list[dict[str, Any]]], mixing: str
) -> None:
    loader = make_loader(mixture, num_workers=2, mixing=mixing)
    assert loader.dataset.quotas == QUOTAS
    assert len(loader) == EPOCH_ROWS // BATCH
    epochs = read_epochs(loader, EPOCHS)
    assert [len(batches) for batches in epochs] == [len(loader)] * EPOCHS
    assert_quotas_and_once_before_twice(epochs)
    if mixing == "random":  # any num_workers reads the same epoch
        for got, expected in zip(epochs, reference, strict=True):
            assert Counter(_ids(got)) == Counter(_ids(expected))
    else:  # every batch holds each source's share within a row or two
        for batch in (b for batches in epochs for b in batches):
            for source, quota in enumerate(QUOTAS):
                share = BATCH * quota / EPOCH_ROWS
                assert abs(batch["source"].count(source) - share) < 2, batch["source"]


@pytest.mark.slow
@pytest.mark.timeout(420)
def test_two_torchrun_ranks_read_equal_batches_and_together_the_whole_epoch(
    mixture: dict[str, Any], reference: list[list[dict[str, Any]]], tmp_path: Path
) -> None:
    # The credentials go in a file, not on the command line.
    path = tmp_path / "config.json"
    path.touch(mode=0o600)
    path.write_text(json.dumps(mixture))
    spec = {"config": str(path), "out": str(tmp_path / "out.json"), "epochs": EPOCHS}
    ranks, _ = run_script("read_mixture.py", 2, {**spec, "num_workers": 2}, timeout=300)
    assert len(ranks) == 2
    assert [rank["quotas"] for rank in ranks] == [list(QUOTAS)] * 2
    assert ranks[0]["fingerprint"] == ranks[1]["fingerprint"]  # one plan on every rank
    assert ranks[0]["len"] == ranks[1]["len"] == EPOCH_ROWS // 2 // BATCH
    for epoch in range(EPOCHS):
        per_rank = [rank["epochs"][epoch] for rank in ranks]
        sizes = [[len(batch["id"]) for batch in batches] for batches in per_rank]
        assert sizes[0] == sizes[1] and len(sizes[0]) == ranks[0]["len"], sizes
        for batches in per_rank:
            for batch in batches:
                assert batch["source"] == [source_of(i) for i in batch["id"]]
        union = Counter(_ids(per_rank[0])) + Counter(_ids(per_rank[1]))
        assert union == Counter(_ids(reference[epoch])), f"epoch {epoch}"
    # Together, the ranks' epochs keep every guarantee of one process's.
    assert_quotas_and_once_before_twice(
        [[b for rank in ranks for b in rank["epochs"][epoch]] for epoch in range(EPOCHS)]
    )


def test_an_iceberg_tables_data_files_are_cached_by_size(
    mixture: dict[str, Any], fault_proxy: MakeProxy, tmp_path: Path
) -> None:
    # An Iceberg table never rewrites a data file under its name: cached with no version token.
    proxy = fault_proxy()
    loader = tdu.create_dataloader(
        [
            tdu.Source(
                table=mixture["table"],
                catalog_config=mixture["catalog_config"],
                storage_options={"endpoint_url": proxy.endpoint_url},
                columns=COLUMNS,
            )
        ],
        batch_size=BATCH,
        shuffle=True,
        num_workers=2,
        cache_dir=tmp_path,
    )
    first, count = TABLE
    every = Counter(range(first, first + count))

    def epoch(e: int) -> Counter[int]:
        loader.set_epoch(e)
        return Counter(i for batch in loader for i in batch["id"].tolist())

    assert epoch(0) == every
    assert proxy.counts["requests"] > 0  # the data files were read through the proxy
    proxy.reset_counts()
    assert epoch(1) == every
    assert proxy.counts["requests"] == 0, sorted(set(proxy.events))[:5]
    stats = loader.cache_epochs[1]
    assert (stats.misses, stats.requests) == (0, 0) and stats.hits > 0
