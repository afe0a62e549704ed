"""Real storage servers, started once per session: SeaweedFS (S3 + Iceberg REST),
fake-gcs-server (GCS), Azurite (Azure Blob) and PostgreSQL; plus a fault-injecting proxy.

Each server listens on free 127.0.0.1 ports, logs under the session's temp dir, and is stopped
by PID when the session ends (tests/services/). A server that is missing or does not start
skips its tests with the reason, or fails them when ``CI=true``: CI must never silently skip.
``scripts/services.sh`` installs what pip cannot (Azurite, PostgreSQL).
"""

from __future__ import annotations

import os

# Before anything imports gcsfs: its experimental default makes every open() wait 60 s on a
# gRPC call the emulator cannot answer. Spawned DataLoader workers inherit the environment.
os.environ["GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT"] = "false"
os.environ["AWS_EC2_METADATA_DISABLED"] = "true"  # never probe EC2 for credentials

import secrets
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NoReturn

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests.services import ServiceError
from tests.services.azurite import Azurite, start_azurite
from tests.services.gcs import FakeGCS, start_fake_gcs
from tests.services.postgres import Postgres, start_postgres
from tests.services.proxy import FaultProxy
from tests.services.seaweedfs import SeaweedFS, start_seaweedfs

BUCKET = "tdu-data"
PREFIX = "ds"
FILES = 8
ROW_GROUPS = 3
GROUP_ROWS = 500
ROWS = FILES * ROW_GROUPS * GROUP_ROWS

# Start and stop times of each server, for the terminal summary.
TIMINGS: dict[str, dict[str, float]] = {}


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "remote: runs against real storage servers started by tests/remote/conftest.py"
    )


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if TIMINGS:
        parts = [
            f"{name} start {t.get('start', float('nan')):.1f} s"
            + (f", stop {t['stop']:.1f} s" if "stop" in t else "")
            for name, t in TIMINGS.items()
        ]
        terminalreporter.write_line("storage servers: " + "; ".join(parts))


def unavailable(reason: str) -> NoReturn:
    """Skip with ``reason``; under CI (``CI=true``), fail instead."""
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(reason, pytrace=False)
    pytest.skip(reason)


def _start(name: str, start: Callable[[], Any]) -> Any:
    began = time.monotonic()
    try:
        server = start()
    except ServiceError as exc:
        unavailable(f"{name} is unavailable: {exc}")
    TIMINGS[name] = {"start": time.monotonic() - began}
    return server


def _stop(name: str, server: Any) -> None:
    began = time.monotonic()
    server.stop()
    TIMINGS.setdefault(name, {})["stop"] = time.monotonic() - began


# --- servers -----------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def seaweedfs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SeaweedFS]:
    """SeaweedFS ``weed mini``: S3 (signature-checked) and an Iceberg REST catalog (table
    bucket ``warehouse``). A fresh random secret, so tests can look for leaks of it."""
    workdir = tmp_path_factory.mktemp("seaweedfs")
    server = _start(
        "SeaweedFS",
        lambda: start_seaweedfs(
            workdir, access_key="tdu-admin", secret_key=f"tdu-secret-{secrets.token_hex(8)}"
        ),
    )
    yield server
    _stop("SeaweedFS", server)


@pytest.fixture(scope="session")
def gcs_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FakeGCS]:
    """fake-gcs-server, in memory."""
    if "gcsfs" in sys.modules:
        import gcsfs

        if gcsfs.GCSFileSystem.__name__ != "GCSFileSystem":
            unavailable(
                "gcsfs was imported before GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT=false was set; "
                "its experimental filesystem stalls on the emulator"
            )
    workdir = tmp_path_factory.mktemp("fake-gcs")
    server = _start("fake-gcs-server", lambda: start_fake_gcs(workdir))
    yield server
    _stop("fake-gcs-server", server)


@pytest.fixture(scope="session")
def azurite(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Azurite]:
    """Azurite's blob service (from .services/node; scripts/services.sh installs it)."""
    workdir = tmp_path_factory.mktemp("azurite")
    server = _start("Azurite", lambda: start_azurite(workdir))
    yield server
    _stop("Azurite", server)


@pytest.fixture(scope="session")
def postgres(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Postgres]:
    """PostgreSQL with an empty database ``iceberg``; ``postgres.uri`` is its SQLAlchemy URI."""
    workdir = tmp_path_factory.mktemp("postgres")
    server = _start("PostgreSQL", lambda: start_postgres(workdir))
    yield server
    _stop("PostgreSQL", server)


# --- the fault proxy ---------------------------------------------------------------------------

MakeProxy = Callable[..., FaultProxy]


@pytest.fixture
def fault_proxy(request: pytest.FixtureRequest) -> Iterator[MakeProxy]:
    """Factory: ``fault_proxy(seed=0, upstream=None, **FaultConfig fields)`` starts a
    `FaultProxy` in front of SeaweedFS's S3 port (or ``upstream=(host, port)``); every proxy
    is stopped after the test."""
    proxies: list[FaultProxy] = []

    def make(
        *, seed: int = 0, upstream: tuple[str, int] | None = None, **config: Any
    ) -> FaultProxy:
        if upstream is None:
            server: SeaweedFS = request.getfixturevalue("seaweedfs")
            upstream = ("127.0.0.1", server.s3_port)
        proxy = FaultProxy(upstream, seed=seed, **config)
        proxies.append(proxy)
        return proxy

    yield make
    for proxy in proxies:
        proxy.stop()


# --- one small Parquet dataset, uploaded once to each store -----------------------------------


def dataset_table(ids: np.ndarray) -> pa.Table:
    """Rows identified by ``id``; every other column is a function of the id."""
    ids = np.asarray(ids, dtype=np.int64)
    return pa.table(
        {
            "id": pa.array(ids),
            "x": pa.array(ids.astype(np.float64) * 0.5),
            "y": pa.array((ids % 97).astype(np.float32)),
            "name": pa.array([f"row-{i}" for i in ids], pa.string()),
        }
    )


@pytest.fixture(scope="session")
def local_dataset(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[int]]:
    """8 Parquet files x 3 row groups x 500 rows (ids a shuffled 0..11999), plus a
    ``_SUCCESS`` marker the loader must skip. Returns (directory, ids in file order)."""
    root = tmp_path_factory.mktemp("dataset") / PREFIX
    root.mkdir()
    ids = np.random.default_rng(2024).permutation(ROWS)
    per_file = ROW_GROUPS * GROUP_ROWS
    for i in range(FILES):
        table = dataset_table(ids[i * per_file : (i + 1) * per_file])
        pq.write_table(table, root / f"part-{i:03d}.parquet", row_group_size=GROUP_ROWS)
    (root / "_SUCCESS").write_bytes(b"")
    return root, ids.tolist()


@dataclass
class RemoteData:
    """The dataset on one store."""

    store: str
    url: str  # the dataset directory, with protocol
    ids: list[int]
    storage_options: dict[str, Any] = field(repr=False)
    fs: Any = field(repr=False)  # an fsspec filesystem on the store
    local: Path = field(repr=False)  # the same files on local disk

    def file_url(self, index: int) -> str:
        return f"{self.url}/part-{index:03d}.parquet"


def _uploaded(
    store: str, protocol: str, fs: Any, options: dict[str, Any], dataset: tuple[Path, list[int]]
) -> RemoteData:
    """The local dataset's files uploaded to ``BUCKET/PREFIX`` on ``fs``."""
    local, ids = dataset
    for path in sorted(local.iterdir()):
        fs.put_file(str(path), f"{BUCKET}/{PREFIX}/{path.name}")
    fs.invalidate_cache()
    return RemoteData(store, f"{protocol}://{BUCKET}/{PREFIX}", ids, options, fs, local)


@pytest.fixture(scope="session")
def s3_data(seaweedfs: SeaweedFS, local_dataset: tuple[Path, list[int]]) -> RemoteData:
    seaweedfs.create_bucket(BUCKET)
    return _uploaded("s3", "s3", seaweedfs.filesystem(), seaweedfs.s3fs_options(), local_dataset)


@pytest.fixture(scope="session")
def gcs_data(gcs_server: FakeGCS, local_dataset: tuple[Path, list[int]]) -> RemoteData:
    gcs_server.create_bucket(BUCKET)
    return _uploaded(
        "gcs", "gs", gcs_server.filesystem(), gcs_server.gcsfs_options(), local_dataset
    )


@pytest.fixture(scope="session")
def azure_data(azurite: Azurite, local_dataset: tuple[Path, list[int]]) -> RemoteData:
    azurite.create_container(BUCKET)
    return _uploaded("azure", "abfs", azurite.filesystem(), azurite.adlfs_options(), local_dataset)
