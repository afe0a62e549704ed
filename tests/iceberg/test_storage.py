"""The table's FileIO properties as storage options, merged under explicit ones; secrets never
in a repr, a log, a state or a pickle of the dataset."""

from __future__ import annotations

import logging
import pickle
from unittest import mock

import pytest

import torch_dataloader_utils as tdu
from tests.iceberg.conftest import Catalog, batch_ids, flat
from torch_dataloader_utils import IcebergDataset, InvalidArgumentError, Source
from torch_dataloader_utils.fs import FileSystemSpec
from torch_dataloader_utils.iceberg.catalog import load_table
from torch_dataloader_utils.iceberg.storage import (
    MergedOptions,
    io_storage_options,
    merge_options,
    protocol_of,
)

pytestmark = pytest.mark.timeout(60)

SECRET = "tdu-do-not-leak-7f3a"


@pytest.mark.parametrize(
    ("location", "protocol"),
    [
        ("s3://b/t", "s3"),
        ("s3a://b/t", "s3"),
        ("gs://b/t", "gs"),
        ("abfss://c@acct.dfs.core.windows.net/t", "abfss"),
        ("file:///tmp/wh/t", "file"),
        ("/tmp/wh/t", "file"),
    ],
)
def test_protocol_of(location: str, protocol: str) -> None:
    assert protocol_of(location) == protocol


def test_protocol_of_an_unknown_scheme() -> None:
    with pytest.raises(InvalidArgumentError, match="unknown storage scheme 'ftp'"):
        protocol_of("ftp://host/t")


def test_s3_properties() -> None:
    properties = {
        "uri": "postgresql+psycopg2://user:pw@host/db",  # catalog-only: left out
        "warehouse": "s3://bucket/",
        "s3.endpoint": "http://127.0.0.1:9000",
        "s3.access-key-id": "AK",
        "s3.secret-access-key": SECRET,
        "s3.session-token": "TOKEN",
        "s3.region": "eu-west-1",
        "s3.path-style-access": "true",
        "gcs.project-id": "other-storage",
    }
    assert io_storage_options("s3", properties) == {
        "key": "AK",
        "secret": SECRET,
        "token": "TOKEN",
        "endpoint_url": "http://127.0.0.1:9000",
        "client_kwargs": {"region_name": "eu-west-1"},
        "config_kwargs": {"s3": {"addressing_style": "path"}},
    }


def test_s3_client_fallbacks_and_anonymous() -> None:
    properties = {"client.access-key-id": "AK", "client.secret-access-key": SECRET}
    assert io_storage_options("s3", properties) == {"key": "AK", "secret": SECRET}
    assert io_storage_options("s3", {"s3.anonymous": "true"}) == {"anon": True}
    assert io_storage_options("file", properties) == {}


def test_s3_remote_signing_without_keys_is_refused() -> None:
    with pytest.raises(InvalidArgumentError, match=r"s3\.signer"):
        io_storage_options("s3", {"s3.signer": "S3V4RestSigner"})


def test_gcs_and_adls_properties() -> None:
    assert io_storage_options(
        "gs",
        {"gcs.project-id": "p", "gcs.oauth2.token": SECRET, "gcs.service.host": "http://h:1"},
    ) == {"project": "p", "token": SECRET, "endpoint_url": "http://h:1"}
    assert io_storage_options(
        "abfs", {"adls.account-name": "acct", "adls.account-key": SECRET}
    ) == {"account_name": "acct", "account_key": SECRET}
    vended = io_storage_options("abfss", {"adls.sas-token.acct.dfs.core.windows.net": SECRET})
    assert vended == {"sas_token": SECRET, "account_name": "acct"}


def test_explicit_options_win_key_by_key() -> None:
    table = {"key": "AK", "secret": "S", "client_kwargs": {"region_name": "eu-west-1"}}
    user = {"secret": "mine", "client_kwargs": {"verify": False}}
    assert merge_options(table, user) == {
        "key": "AK",
        "secret": "mine",
        "client_kwargs": {"region_name": "eu-west-1", "verify": False},
    }
    assert merge_options(table, None) == table


def _user_options() -> dict[str, str]:
    return {"secret": "fresh"}


def test_an_options_function_is_called_per_process_and_hides_values() -> None:
    merged = merge_options({"key": "AK", "secret": SECRET}, _user_options)
    assert isinstance(merged, MergedOptions)
    assert merged() == {"key": "AK", "secret": "fresh"}
    assert pickle.loads(pickle.dumps(merged))() == {"key": "AK", "secret": "fresh"}
    assert SECRET not in repr(merged)
    spec = FileSystemSpec("s3", merged)
    assert SECRET not in repr(spec)


def test_catalog_properties_reach_the_table_fileio(catalog: Catalog) -> None:
    """pyiceberg gives a table's FileIO the catalog's properties: ours translate them."""
    config = {**catalog.config, "s3.endpoint": "http://127.0.0.1:1", "s3.secret-access-key": SECRET}
    catalog.create("t", [range(10)])
    table = load_table("db.t", config)
    options = io_storage_options("s3", table.io.properties)
    assert options["endpoint_url"] == "http://127.0.0.1:1" and options["secret"] == SECRET


def test_secrets_stay_out_of_reprs_logs_states_and_pickles(
    catalog: Catalog, caplog: pytest.LogCaptureFixture
) -> None:
    catalog.create("t", [range(300)])
    config = {**catalog.config, "s3.secret-access-key": SECRET, "adls.account-key": SECRET}
    caplog.set_level(logging.DEBUG)
    load, dataset = IcebergDataset.create_dataloader(
        table="db.t",
        catalog_config=config,
        batch_size=64,
        num_workers=2,
        multiprocessing_context="fork",
        timeout=60,
    )
    assert sorted(flat(batch_ids(load))) == list(range(300))
    for text in (
        repr(dataset),
        repr(dataset.read_options),
        repr(dataset.fs),
        repr(load.state_dict()),
        caplog.text,
    ):
        assert SECRET not in text
    assert SECRET.encode() not in pickle.dumps(dataset)  # the catalog config is not kept
    assert not hasattr(dataset, "_catalog_config")


def _rank_options() -> dict[str, str]:
    return {"rank_marker": "this rank's"}


def test_the_plan_carries_the_tables_storage_never_the_users_options(catalog: Catalog) -> None:
    """Rank 0 broadcasts (pickles) its plan: the table's storage travels in it, rank 0's
    storage_options do not. A rank that receives it reads under its own options (a function:
    called in its own processes), backend and retries."""
    from torch_dataloader_utils.dataset.tables import plan_table

    catalog.create("t", [range(300)])
    rank0 = FileSystemSpec("file", {"rank_marker": SECRET})
    planned = plan_table(Source(table="db.t", catalog_config=catalog.config), rank0)
    received = pickle.dumps(planned)  # the source's plan, as rank 0 broadcasts it
    assert SECRET.encode() not in received
    assert planned.fs is not None and planned.fs.protocol == "file"
    assert not hasattr(planned.read_options, "storage")

    class Received:  # rank 1's `Spread`: rank 0's plan arrives; make() is never called
        active = True

        def __init__(self, *, explicit: bool) -> None:
            pass

        def from_rank0(self, make: object) -> object:
            return pickle.loads(received)

    with mock.patch("torch_dataloader_utils.sources.planned.Spread", Received):
        load, dataset = IcebergDataset.create_dataloader(
            table="db.t",
            catalog_config=catalog.config,
            storage_options=_rank_options,
            storage_backend="fsspec",
            retries=2,
            rank=1,
            world_size=2,
            batch_size=50,
        )
    assert dataset.fs.protocol == "file" and dataset.fs.backend == "fsspec"
    assert dataset.fs.retry.max_attempts == 3 and dataset.fs.refreshable
    assert dataset.fs.storage_options == {"rank_marker": "this rank's"}
    assert len(flat(batch_ids(load))) == 150


def test_an_unreachable_catalog_database_is_a_storage_error() -> None:
    import socket

    with socket.socket() as probe:  # a loopback port nobody listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    config = {"type": "sql", "uri": f"postgresql+psycopg2://postgres@127.0.0.1:{port}/iceberg"}
    with pytest.raises(tdu.StorageError, match="catalog database cannot be reached"):
        tdu.IcebergDataset.create_dataloader(table="db.events", catalog_config=config)


def test_catalog_errors_do_not_show_configuration_values() -> None:
    config = {"uri": "mysql+pymysql://admin:S3cr3tPW@db/iceberg"}
    with pytest.raises(InvalidArgumentError) as caught:
        tdu.IcebergDataset.create_dataloader(table="db.events", catalog_config=config)
    assert "S3cr3tPW" not in str(caught.value) and "['uri']" in str(caught.value)
