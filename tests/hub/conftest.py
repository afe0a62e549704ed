"""The Hub tests' server: one `HubServer` for the session, huggingface_hub pointed at it."""

from __future__ import annotations

import io
import os
from collections.abc import Iterator

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests.services.hub import HubServer


def parquet_bytes(ids: range | np.ndarray, *, row_group_size: int = 25) -> bytes:
    """A Parquet file of rows ``id`` (and ``value = id * 2``), in row groups of
    ``row_group_size`` rows."""
    ids = np.asarray(ids, dtype=np.int64)
    table = pa.table({"id": ids, "value": ids * 2})
    sink = io.BytesIO()
    pq.write_table(table, sink, row_group_size=row_group_size)
    return sink.getvalue()


def shards(first: int, count: int, rows: int, folder: str = "data") -> dict[str, bytes]:
    """``count`` files of ``rows`` rows each, ids from ``first`` on, under ``folder``."""
    return {
        f"{folder}/part-{i}.parquet": parquet_bytes(range(first + i * rows, first + (i + 1) * rows))
        for i in range(count)
    }


@pytest.fixture(scope="session")
def hub() -> Iterator[HubServer]:
    """The server, with ``HF_ENDPOINT`` naming it: in this process (huggingface_hub's constant
    too, if it was imported before) and in every DataLoader worker, forked or spawned."""
    server = HubServer()
    saved = {k: os.environ.get(k) for k in ("HF_ENDPOINT", "HF_TOKEN", "HF_HUB_DISABLE_TELEMETRY")}
    os.environ["HF_ENDPOINT"] = server.endpoint
    os.environ["HF_HUB_DISABLE_TELEMETRY"] = "1"
    os.environ.pop("HF_TOKEN", None)
    import huggingface_hub.constants as constants

    endpoint = constants.ENDPOINT
    constants.ENDPOINT = server.endpoint
    try:
        yield server
    finally:
        constants.ENDPOINT = endpoint
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        server.stop()


@pytest.fixture
def fresh(hub: HubServer) -> HubServer:
    """The server with its counts and faults reset."""
    hub.reset()
    return hub
