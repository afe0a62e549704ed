"""Iceberg tables on real catalogs and storage: a SQL catalog on PostgreSQL, the REST catalog
SeaweedFS serves with an S3 warehouse, and a SQL catalog with an S3 warehouse. Every row exactly
once with two worker processes; data read with the catalog's FileIO properties (no explicit
storage options), position deletes on S3, and no secret in any repr, log or state."""

from __future__ import annotations

import logging
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pytest

pytest.importorskip("pyiceberg")

from pyiceberg.catalog import Catalog, load_catalog
from pyiceberg.exceptions import NoSuchNamespaceError

import torch_dataloader_utils as tdu
from tests.iceberg.conftest import (
    batch_ids,
    commit_position_deletes,
    data_files,
    flat,
    rows,
)
from tests.packed_data import Where, documents, token_table, tokens_of
from tests.services.postgres import Postgres
from tests.services.seaweedfs import SeaweedFS
from torch_dataloader_utils import IcebergDataset

pytestmark = [
    pytest.mark.remote,
    pytest.mark.timeout(180),
    pytest.mark.filterwarnings("ignore:This DataLoader will create:UserWarning"),
]

PARTS = [range(0, 1200), range(1200, 1500), range(1500, 1530)]
ROWS = 1530


def _s3_properties(server: SeaweedFS) -> dict[str, str]:
    return {
        "s3.endpoint": server.endpoint_url,
        "s3.access-key-id": server.access_key,
        "s3.secret-access-key": server.secret_key,
        "s3.region": server.region,
        "s3.path-style-access": "true",
    }


def _rest_config(server: SeaweedFS) -> dict[str, str]:
    """The REST catalog SeaweedFS serves, its warehouse on its S3."""
    return {
        "name": "tdu_rest",
        "type": "rest",
        "uri": server.iceberg_uri,
        "warehouse": "s3://warehouse",
        "rest.sigv4-enabled": "true",
        "rest.signing-region": server.region,
        "rest.signing-name": "s3tables",
        "client.access-key-id": server.access_key,
        "client.secret-access-key": server.secret_key,
        "client.region": server.region,
        **_s3_properties(server),
    }


def _catalog(config: dict[str, str], *, wait: float = 20.0) -> Catalog:
    """The catalog of ``config``. SeaweedFS creates its table bucket a moment after it answers
    (``weed mini -tableBucket``): until then the REST catalog says the warehouse is unknown,
    so a REST catalog is polled (bounded) until it lists namespaces."""
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


def _create(config: dict[str, str]) -> tuple[Catalog, str]:
    """A table ``ns_<random>.events`` of PARTS (each part one data file, row groups of 100)."""
    catalog = _catalog(config)
    namespace = f"ns_{uuid.uuid4().hex[:8]}"
    catalog.create_namespace(namespace)
    name = f"{namespace}.events"
    table = catalog.create_table(
        name, schema=rows([]).schema, properties={"write.parquet.row-group-limit": "100"}
    )
    for part in PARTS:
        table.append(rows(part))
    return catalog, name


def _read(config: dict[str, str], name: str, **options: Any) -> tuple[list[int], IcebergDataset]:
    loader, dataset = IcebergDataset.create_dataloader(
        table=name,
        catalog_config=config,
        batch_size=128,
        num_workers=2,
        shuffle=True,
        multiprocessing_context="fork",
        timeout=60,
        **options,
    )
    ids = flat(batch_ids(loader))
    state = repr(loader.state_dict())
    for secret in [v for k, v in config.items() if "secret" in k]:
        assert secret not in state and secret not in repr(dataset)
    return ids, dataset


def test_sql_catalog_on_postgresql(postgres: Postgres, tmp_path: Path) -> None:
    config = {
        "name": "tdu_pg",
        "type": "sql",
        "uri": postgres.uri,
        "warehouse": f"file://{tmp_path}/warehouse",
    }
    _, name = _create(config)
    ids, dataset = _read(config, name)
    assert Counter(ids) == Counter(range(ROWS))
    assert len(dataset.plan.chunks) == 12 + 3 + 1


def test_rest_catalog_with_an_s3_warehouse(
    seaweedfs: SeaweedFS, caplog: pytest.LogCaptureFixture
) -> None:
    config = _rest_config(seaweedfs)
    _, name = _create(config)
    caplog.set_level(logging.DEBUG)
    ids, dataset = _read(config, name)
    assert Counter(ids) == Counter(range(ROWS))
    # The catalog's FileIO properties reached the filesystem the data is read through.
    assert dataset.fs.protocol == "s3"
    options = dataset.fs.storage_options
    assert options["endpoint_url"] == seaweedfs.endpoint_url
    assert options["key"] == seaweedfs.access_key
    assert seaweedfs.secret_key not in caplog.text


def test_sql_catalog_with_an_s3_warehouse_and_deletes(seaweedfs: SeaweedFS, tmp_path: Path) -> None:
    bucket = f"tdu-iceberg-{uuid.uuid4().hex[:8]}"
    seaweedfs.create_bucket(bucket)
    config = {
        "name": "tdu_sql_s3",
        "type": "sql",
        "uri": f"sqlite:///{tmp_path}/catalog.db",
        "warehouse": f"s3://{bucket}/warehouse",
        **_s3_properties(seaweedfs),
    }
    catalog, name = _create(config)
    table = catalog.load_table(name)
    big = next(f for f in data_files(table) if f.record_count == 1200)
    # Ids of the big file are its positions; delete some in later row groups.
    gone = [0, 150, *range(500, 600), 1199]
    commit_position_deletes(table, {big.file_path: gone})
    ids, dataset = _read(config, name, filters="id < 1400")
    assert Counter(ids) == Counter(i for i in range(1400) if i not in gone)
    assert dataset.fs.protocol == "s3"
    # Explicit storage options win over the catalog's, key by key.
    ids, dataset = _read(config, name, storage_options={"client_kwargs": {"verify": False}})
    assert dataset.fs.storage_options["client_kwargs"] == {
        "region_name": seaweedfs.region,
        "verify": False,
    }
    assert Counter(ids) == Counter(i for i in range(ROWS) if i not in gone)


def test_a_packed_table_on_the_rest_catalog_reads_every_token_once(seaweedfs: SeaweedFS) -> None:
    """Token counts planned from S3 through the catalog's FileIO, a filter applied: every
    token of the rows that pass once over two ranks, equal batches."""
    config = _rest_config(seaweedfs)
    catalog = _catalog(config)
    namespace = f"ns_{uuid.uuid4().hex[:8]}"
    catalog.create_namespace(namespace)
    rng = np.random.default_rng(3)
    where: Where = {}
    parts = [
        token_table(documents(rng, n, where, first), first) for n, first in ((150, 0), (90, 150))
    ]
    table = catalog.create_table(
        f"{namespace}.docs",
        schema=parts[0].schema,
        properties={"write.parquet.row-group-limit": "40"},
    )
    for part in parts:
        table.append(part)
    expected = {t for t, (d, _) in where.items() if d % 7 != 3}  # (documents are ids)
    seen: Counter[int] = Counter()
    batches = []
    for rank in range(2):
        loader, _ = IcebergDataset.create_dataloader(
            table=f"{namespace}.docs",
            catalog_config=config,
            packing=tdu.Packing("tokens", seq_len=16, pad_value=-1),
            filters="label != 3",
            batch_size=2,
            shuffle=True,
            num_workers=2,
            multiprocessing_context="fork",
            timeout=60,
            rank=rank,
            world_size=2,
        )
        got = [tokens_of(b, where, seq_len=16, batch_size=2) for b in loader]
        assert len(got) == len(loader)
        batches.append(len(got))
        seen.update(t for b in got for t in b)
    assert batches[0] == batches[1]
    assert max(seen.values()) == 1 and set(seen) <= expected
    assert len(expected) - len(seen) == len(expected) % 2
