"""Listing an object store that cannot be reached: retried, then one `StorageError` naming the
bucket, never a raw SDK error. No server is needed: a loopback port nothing listens on."""

from __future__ import annotations

import time

import pytest

import torch_dataloader_utils as tdu
from tests.services.ports import free_port


def unreachable_s3() -> dict[str, object]:
    return {
        "key": "k",
        "secret": "s",
        "client_kwargs": {"endpoint_url": f"http://127.0.0.1:{free_port()}", "region_name": "x"},
        # botocore's own retries off, so the library's are the ones counted
        "config_kwargs": {"retries": {"max_attempts": 1}, "connect_timeout": 1},
    }


@pytest.mark.parametrize("source", ["s3://bucket/data/", "s3://bucket/data/*.parquet"])
def test_an_unreachable_endpoint_at_listing_is_retried_then_a_storage_error(
    source: str, caplog: pytest.LogCaptureFixture
) -> None:
    started = time.monotonic()
    with pytest.raises(tdu.StorageError, match=r"s3://bucket/data.*failed after 4 attempt"):
        tdu.create_dataloader(source, storage_options=unreachable_s3(), retries=3, num_workers=0)
    assert time.monotonic() - started < 60
    retried = [r for r in caplog.records if "retry" in r.getMessage()]
    assert len(retried) == 3 and all("s3://bucket/data" in r.getMessage() for r in retried)
