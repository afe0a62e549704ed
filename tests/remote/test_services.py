"""The servers themselves: each answers on loopback, and the catalogs the Iceberg tests build on
(pyiceberg's SqlCatalog on PostgreSQL, SeaweedFS's Iceberg REST catalog) work."""

from __future__ import annotations

import importlib.util

import pytest

from tests.remote.conftest import BUCKET, PREFIX, RemoteData, unavailable
from tests.services.azurite import Azurite
from tests.services.gcs import FakeGCS
from tests.services.postgres import Postgres
from tests.services.seaweedfs import SeaweedFS

pytestmark = [pytest.mark.remote, pytest.mark.timeout(60)]


def test_servers_listen_on_loopback(
    seaweedfs: SeaweedFS, gcs_server: FakeGCS, azurite: Azurite
) -> None:
    for url in (seaweedfs.endpoint_url, seaweedfs.iceberg_uri, gcs_server.endpoint_url):
        assert url.startswith("http://127.0.0.1:")
    assert azurite.endpoint_url.startswith("http://127.0.0.1:")
    for server in (seaweedfs, gcs_server, azurite):
        assert server.process.alive()


def test_seaweedfs_checks_signatures(seaweedfs: SeaweedFS, s3_data: RemoteData) -> None:
    import s3fs

    path = f"{BUCKET}/{PREFIX}/part-000.parquet"
    assert s3_data.fs.cat_file(path, start=0, end=4) == b"PAR1"
    wrong = s3fs.S3FileSystem(
        skip_instance_cache=True, **{**seaweedfs.s3fs_options(), "secret": "wrong-secret"}
    )
    with pytest.raises(PermissionError):
        wrong.ls(BUCKET)
    anonymous = s3fs.S3FileSystem(
        skip_instance_cache=True, anon=True, endpoint_url=seaweedfs.endpoint_url
    )
    with pytest.raises(PermissionError):
        anonymous.cat_file(path)


def test_postgres_sql_catalog(postgres: Postgres, tmp_path: pytest.TempPathFactory) -> None:
    pyarrow = pytest.importorskip("pyarrow")
    sql = pytest.importorskip("pyiceberg.catalog.sql")
    catalog = sql.SqlCatalog("pg", uri=postgres.uri, warehouse=f"file://{tmp_path}")
    catalog.create_namespace("svc")
    table = catalog.create_table("svc.t", schema=pyarrow.schema([("id", pyarrow.int64())]))
    table.append(pyarrow.table({"id": pyarrow.array([1, 2, 3], pyarrow.int64())}))
    assert ("svc",) in catalog.list_namespaces()
    assert sorted(catalog.load_table("svc.t").scan().to_arrow()["id"].to_pylist()) == [1, 2, 3]
    catalog.drop_table("svc.t")
    catalog.drop_namespace("svc")


def test_seaweedfs_iceberg_rest_catalog(seaweedfs: SeaweedFS) -> None:
    pyarrow = pytest.importorskip("pyarrow")
    if importlib.util.find_spec("boto3") is None:  # pyiceberg signs REST requests with boto3
        unavailable("the Iceberg REST catalog's SigV4 signing needs boto3 (pip install boto3)")
    catalog_module = pytest.importorskip("pyiceberg.catalog")
    catalog = catalog_module.load_catalog("rest", **seaweedfs.iceberg_rest_properties())
    catalog.create_namespace("svc")
    table = catalog.create_table("svc.t", schema=pyarrow.schema([("id", pyarrow.int64())]))
    table.append(pyarrow.table({"id": pyarrow.array([4, 5], pyarrow.int64())}))
    assert sorted(catalog.load_table("svc.t").scan().to_arrow()["id"].to_pylist()) == [4, 5]
    assert ("svc",) in catalog.list_namespaces()
