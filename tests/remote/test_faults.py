"""Transient storage faults, injected by a proxy in front of SeaweedFS: retried, counted, logged,
and every row still read exactly once; permanent failures name the file."""

from __future__ import annotations

import logging
from collections import Counter
from typing import Any

import pytest

import torch_dataloader_utils as tdu
from torch_dataloader_utils import RetryPolicy, StorageError, StorageNotFoundError

from .conftest import MakeProxy, RemoteData

pytestmark = pytest.mark.remote

FAST = RetryPolicy(max_attempts=8, initial_delay=0.01, max_delay=0.05, request_timeout=5.0)


def _ids(loader: Any) -> Counter[int]:
    got: Counter[int] = Counter()
    for epoch in range(2):
        loader.set_epoch(epoch)
        for batch in loader:
            got.update(batch["id"].tolist())
    return got


@pytest.mark.parametrize("backend", ["arrow", "fsspec"])
def test_faulty_reads_deliver_every_row_once(
    s3_data: RemoteData, fault_proxy: MakeProxy, backend: str
) -> None:
    proxy = fault_proxy(seed=7)
    options = {**s3_data.storage_options, "endpoint_url": proxy.endpoint_url}
    loader = tdu.create_dataloader(
        s3_data.url,
        batch_size=256,
        shuffle=True,
        num_workers=2,
        storage_options=options,
        storage_backend=backend,
        retries=FAST,
    )
    # Planning is clean; reading gets 503 SlowDown, slow answers and dropped connections on
    # a share of the data requests.
    proxy.configure(
        slowdown_rate=0.15, slow_rate=0.1, drop_rate=0.1, delay=0.2, ranged_gets_only=True
    )
    got = _ids(loader)
    assert got == Counter(s3_data.ids * 2)
    assert proxy.counts["slowdown"] > 0 and proxy.counts["drop"] > 0, proxy.counts
    if backend == "arrow":
        # The native filesystem tries once; every retry is ours, so it is counted (workers'
        # retries included). s3fs retries inside itself, out of our sight.
        assert loader.dataset.storage_retries >= proxy.counts["slowdown"]


def test_retries_are_logged_with_the_file(
    s3_data: RemoteData, fault_proxy: MakeProxy, caplog: pytest.LogCaptureFixture
) -> None:
    proxy = fault_proxy(seed=3)
    options = {**s3_data.storage_options, "endpoint_url": proxy.endpoint_url}
    loader = tdu.create_dataloader(
        s3_data.url,
        batch_size=500,
        num_workers=0,
        storage_options=options,
        storage_backend="arrow",
        retries=FAST,
    )
    proxy.configure(slowdown_rate=0.3, ranged_gets_only=True)
    with caplog.at_level(logging.WARNING, logger="torch_dataloader_utils.storage"):
        got = _ids(loader)
    assert got == Counter(s3_data.ids * 2)
    retries = [r for r in caplog.records if r.name == "torch_dataloader_utils.storage"]
    assert retries and len(retries) == loader.dataset.storage_retries
    for record in retries:
        message = record.getMessage()
        assert f"{s3_data.url}/part-" in message and "retry" in message
        assert s3_data.storage_options["secret"] not in message


def test_timeouts_are_retried(s3_data: RemoteData, fault_proxy: MakeProxy) -> None:
    proxy = fault_proxy(seed=5)
    options = {**s3_data.storage_options, "endpoint_url": proxy.endpoint_url}
    policy = RetryPolicy(max_attempts=8, initial_delay=0.01, max_delay=0.05, request_timeout=1)
    loader = tdu.create_dataloader(
        s3_data.url,
        batch_size=500,
        num_workers=0,
        storage_options=options,
        storage_backend="arrow",
        retries=policy,
    )
    proxy.configure(slow_rate=0.2, delay=3.0, ranged_gets_only=True, max_faults=3)
    got: Counter[int] = Counter()
    for batch in loader:
        got.update(batch["id"].tolist())
    assert got == Counter(s3_data.ids)
    assert proxy.counts["slow"] == 3
    assert loader.dataset.storage_retries >= 3


@pytest.mark.parametrize("backend", ["arrow", "fsspec"])
def test_a_fault_that_persists_names_the_file(
    s3_data: RemoteData, fault_proxy: MakeProxy, backend: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    proxy = fault_proxy()
    options = {**s3_data.storage_options, "endpoint_url": proxy.endpoint_url}
    policy = RetryPolicy(max_attempts=3, initial_delay=0.01, max_delay=0.02)
    if backend == "fsspec":
        # botocore's own retries, and s3fs's around them (5, backing off 1.9 s in all, for
        # every read in flight: 54 s for this test): one attempt each keeps the test short.
        import s3fs

        options["config_kwargs"] = {"retries": {"max_attempts": 1}}
        monkeypatch.setattr(s3fs.S3FileSystem, "retries", 1)
    loader = tdu.create_dataloader(
        s3_data.url,
        batch_size=500,
        num_workers=0,
        storage_options=options,
        storage_backend=backend,
        retries=policy,
    )
    proxy.configure(slowdown_rate=1.0, ranged_gets_only=True)
    with pytest.raises(StorageError) as caught:
        for _ in loader:
            pass
    assert f"{s3_data.url}/part-" in str(caught.value)
    if backend == "arrow":
        assert "after 3 attempt(s)" in str(caught.value)
        # The failed request tried 3 times (2 retries); the next row group's fetch, in flight
        # too, may still be retrying when the error arrives.
        assert loader.dataset.storage_retries >= 2


def test_a_missing_object_is_not_retried(s3_data: RemoteData, tmp_path: Any) -> None:
    # A copy of the dataset, one file of which disappears after planning.
    fs = s3_data.fs
    copy = f"{s3_data.url.split('://', 1)[1]}-missing"
    fs.copy(s3_data.url.split("://", 1)[1], copy, recursive=True)
    fs.invalidate_cache()
    loader = tdu.create_dataloader(
        f"s3://{copy}",
        batch_size=500,
        num_workers=0,
        storage_options=s3_data.storage_options,
        storage_backend="arrow",
        retries=FAST,
    )
    fs.rm(f"{copy}/part-003.parquet")
    with pytest.raises(StorageNotFoundError) as caught:
        for _ in loader:
            pass
    assert "part-003.parquet" in str(caught.value)
    assert loader.dataset.storage_retries == 0
