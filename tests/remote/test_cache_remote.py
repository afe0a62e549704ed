"""The node-local cache against real stores (SeaweedFS S3, fake-gcs-server), requests counted by
a proxy in front of the store: a cached epoch asks the store nothing and survives it being
gone; a cache smaller than the data stays under its limit and serves the same share each epoch;
a file changed between runs is read again; a second plan reads no footer."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.parquet as pq
import pytest

import torch_dataloader_utils as tdu
from tests.services.gcs import FakeGCS
from torch_dataloader_utils import RetryPolicy
from torch_dataloader_utils.cache import CacheConfig, RangeStore

from .conftest import BUCKET, MakeProxy, RemoteData, dataset_table

pytestmark = pytest.mark.remote

FAST = RetryPolicy(max_attempts=2, initial_delay=0.01, max_delay=0.02, request_timeout=5.0)


def _epoch(loader: Any, epoch: int) -> Counter[int]:
    loader.set_epoch(epoch)
    got: Counter[int] = Counter()
    for batch in loader:
        got.update(batch["id"].tolist())
    return got


def _loader(data: RemoteData, endpoint: str, cache: Path, **options: Any) -> Any:
    storage = {**data.storage_options, "endpoint_url": endpoint}
    return tdu.create_dataloader(
        data.url,
        batch_size=500,
        shuffle=True,
        storage_options=storage,
        retries=FAST,
        cache_dir=cache,
        **options,
    )


def _data_bytes(data: RemoteData) -> int:
    return sum(p.stat().st_size for p in data.local.glob("*.parquet"))


@pytest.mark.parametrize(
    ("backend", "workers"), [("arrow", 2), ("fsspec", 2), ("arrow", 0)], ids=str
)
def test_a_cached_epoch_asks_the_store_nothing_and_survives_it_gone(
    s3_data: RemoteData, fault_proxy: MakeProxy, tmp_path: Path, backend: str, workers: int
) -> None:
    proxy = fault_proxy()
    loader = _loader(
        s3_data, proxy.endpoint_url, tmp_path, storage_backend=backend, num_workers=workers
    )
    assert _epoch(loader, 0) == Counter(s3_data.ids)
    first = loader.cache_stats  # planning and epoch 0 (planning's footer reads may hold it all)
    assert first is not None and first.misses > 0 and first.bytes_from_store > 0
    proxy.reset_counts()
    assert _epoch(loader, 1) == Counter(s3_data.ids)
    assert proxy.counts["requests"] == 0, proxy.events[:5]
    second = loader.cache_epochs[1]
    assert (second.misses, second.bytes_from_store, second.requests) == (0, 0, 0)
    assert second.hits > 0 and second.bytes_from_cache >= first.bytes_from_store * 0.9
    proxy.stop()  # the store unreachable: the cache holds everything the plan reads
    assert _epoch(loader, 2) == Counter(s3_data.ids)


def test_a_cache_smaller_than_the_data_stays_under_its_limit(
    s3_data: RemoteData, fault_proxy: MakeProxy, tmp_path: Path
) -> None:
    proxy = fault_proxy()
    limit = _data_bytes(s3_data) // 3
    loader = _loader(s3_data, proxy.endpoint_url, tmp_path, num_workers=2, cache_limit=limit)
    store = RangeStore(CacheConfig(str(tmp_path), limit))
    for epoch in range(3):
        assert _epoch(loader, epoch) == Counter(s3_data.ids)
        held = store.summary()
        assert 0 < held.bytes <= limit, held
    stats = loader.cache_epochs
    assert stats[0].bypassed > 0  # what did not fit was read, not stored
    # The same share is served every later epoch: kept, not churned by the shuffled order.
    assert stats[1].hits > 0 and stats[2].hits > 0
    assert stats[2].bytes_from_cache >= 0.5 * stats[1].bytes_from_cache


def test_a_file_changed_between_runs_is_read_again(
    s3_data: RemoteData, fault_proxy: MakeProxy, tmp_path: Path
) -> None:
    proxy = fault_proxy()
    first = _loader(s3_data, proxy.endpoint_url, tmp_path / "cache", num_workers=0)
    assert _epoch(first, 0) == Counter(s3_data.ids)
    # Rewrite one file with other rows, under its name: its identity (ETag, size) changes.
    changed = tmp_path / "changed.parquet"
    new_ids = np.arange(10**6, 10**6 + 1500)
    pq.write_table(dataset_table(new_ids), changed, row_group_size=500)
    victim = s3_data.file_url(3).removeprefix("s3://")
    old = pq.read_table(s3_data.local / "part-003.parquet").column("id").to_pylist()
    s3_data.fs.put_file(str(changed), victim)
    try:
        second = _loader(s3_data, proxy.endpoint_url, tmp_path / "cache", num_workers=0)
        expected = Counter(s3_data.ids) - Counter(old) + Counter(new_ids.tolist())
        assert _epoch(second, 0) == expected
        stats = second.cache_stats
        assert stats.misses > 0 and stats.hits > 0  # the changed file read, the others not
    finally:
        s3_data.fs.put_file(str(s3_data.local / "part-003.parquet"), victim)
        s3_data.fs.invalidate_cache()


def test_a_second_plan_reads_no_footer(
    s3_data: RemoteData, fault_proxy: MakeProxy, tmp_path: Path
) -> None:
    proxy = fault_proxy()
    _loader(s3_data, proxy.endpoint_url, tmp_path, num_workers=0)
    cold = list(proxy.events)
    assert any(method in ("GET", "HEAD") and "list-type" not in t for method, t, _ in cold)
    proxy.reset_counts()
    loader = _loader(s3_data, proxy.endpoint_url, tmp_path, num_workers=0)
    # The listing is asked again (it is what tells a file changed); nothing else is.
    assert proxy.events and all("list-type" in target for _, target, _ in proxy.events), (
        proxy.events
    )
    assert loader.cache_stats is not None and loader.cache_stats.hits > 0
    assert _epoch(loader, 0) == Counter(s3_data.ids)


def test_gcs_a_cached_epoch_asks_the_store_nothing(
    gcs_server: FakeGCS, gcs_data: RemoteData, fault_proxy: MakeProxy, tmp_path: Path
) -> None:
    proxy = fault_proxy(upstream=("127.0.0.1", gcs_server.port))
    # (gcsfs: pyarrow's GCS client does not get through the proxy)
    loader = _loader(
        gcs_data, proxy.endpoint_url, tmp_path, num_workers=2, storage_backend="fsspec"
    )
    assert _epoch(loader, 0) == Counter(gcs_data.ids)
    proxy.reset_counts()
    assert _epoch(loader, 1) == Counter(gcs_data.ids)
    assert proxy.counts["requests"] == 0, proxy.events[:5]
    assert loader.cache_epochs[1].hits > 0


def test_no_name_in_the_cache_holds_a_path_or_a_secret(
    s3_data: RemoteData, fault_proxy: MakeProxy, tmp_path: Path
) -> None:
    proxy = fault_proxy()
    loader = _loader(s3_data, proxy.endpoint_url, tmp_path / "cache", num_workers=0)
    assert _epoch(loader, 0) == Counter(s3_data.ids)
    names = [p.name for p in (tmp_path / "cache").rglob("*")]
    assert len(names) > 20
    secrets = [s3_data.storage_options["key"], s3_data.storage_options["secret"]]
    for word in [BUCKET, "part-0", *secrets]:
        assert not [n for n in names if word in n], word
    # and nothing was written outside the cache directory
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cache"]
