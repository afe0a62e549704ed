"""The node-local cache against real stores (SeaweedFS S3, fake-gcs-server), requests counted by
a proxy in front of the store: a cached epoch asks the store nothing and survives it being
gone; a cache smaller than the data stays under its limit and serves the same share each epoch;
a file changed between restarts is read again; a second plan reads no footer."""

from __future__ import annotations

import json
import threading
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.parquet as pq
import pytest

import torch_dataloader_utils as tdu
from tests.distributed.conftest import run_script
from tests.services.gcs import FakeGCS
from tests.services.proxy import Request
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
    ("backend", "workers", "context"),
    [("arrow", 2, "fork"), ("fsspec", 2, "fork"), ("arrow", 2, "spawn"), ("arrow", 0, None)],
    ids=str,
)
def test_a_cached_epoch_asks_the_store_nothing_and_survives_it_gone(
    s3_data: RemoteData,
    fault_proxy: MakeProxy,
    tmp_path: Path,
    backend: str,
    workers: int,
    context: str | None,
) -> None:
    proxy = fault_proxy()
    loader = _loader(
        s3_data,
        proxy.endpoint_url,
        tmp_path,
        storage_backend=backend,
        num_workers=workers,
        multiprocessing_context=context,
        # Spawned workers started once (~3.5 s each); forked ones anew each epoch, so new
        # processes still find the cache and ask nothing.
        persistent_workers=context == "spawn",
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
    # The listing is asked again (it is what tells a file changed); nothing else is, and the
    # kept plan (sources.kept) spares even the footers the cache holds.
    assert proxy.events and all("list-type" in target for _, target, _ in proxy.events), (
        proxy.events
    )
    assert loader.cache_stats is not None and loader.cache_stats.hits == 0
    assert _epoch(loader, 0) == Counter(s3_data.ids)


@pytest.mark.parametrize("backend", ["auto", "fsspec"])
def test_planning_downloads_each_footer_into_the_cache_once(
    s3_data: RemoteData, fault_proxy: MakeProxy, tmp_path: Path, backend: str
) -> None:
    """Natively (pyarrow's client, outside the GIL), an open and a ranged read per file; through
    s3fs, one ranged read (docs/benchmarks.md, cached downloads opened natively)."""
    proxy = fault_proxy()
    loader = _loader(s3_data, proxy.endpoint_url, tmp_path, num_workers=0, storage_backend=backend)
    files = {p.name for p in s3_data.local.glob("*.parquet")}
    asked: dict[str, Counter[str]] = {}
    for method, target, _ in proxy.events:
        name = target.split("?")[0].rsplit("/", 1)[-1]
        if name in files:  # (not the listing, nor the HEAD asking what the prefix is)
            asked.setdefault(name, Counter())[method] += 1
    want = Counter({"HEAD": 1, "GET": 1}) if backend == "auto" else Counter({"GET": 1})
    assert asked == {name: want for name in files}, asked
    stats = loader.cache_stats
    assert stats is not None and stats.misses == len(files)
    assert stats.requests == sum(want.values()) * len(files)
    assert _epoch(loader, 0) == Counter(s3_data.ids)


def test_a_restart_rereads_the_footer_of_a_changed_file_alone(
    s3_data: RemoteData, fault_proxy: MakeProxy, tmp_path: Path
) -> None:
    proxy = fault_proxy()
    _loader(s3_data, proxy.endpoint_url, tmp_path, num_workers=0)
    changed = tmp_path / "changed.parquet"
    pq.write_table(dataset_table(np.arange(10**6, 10**6 + 1500)), changed, row_group_size=500)
    victim = s3_data.file_url(5).removeprefix("s3://")
    s3_data.fs.put_file(str(changed), victim)
    try:
        proxy.events.clear()
        loader = _loader(s3_data, proxy.endpoint_url, tmp_path, num_workers=0)
        read = {t.split("?")[0] for _, t, _ in proxy.events if "list-type" not in t}
        assert read == {f"/{victim}"}, read  # the changed file's footer, and only its
        old = pq.read_table(s3_data.local / "part-005.parquet").column("id").to_pylist()
        new = range(10**6, 10**6 + 1500)
        assert _epoch(loader, 0) == Counter(s3_data.ids) - Counter(old) + Counter(new)
    finally:
        s3_data.fs.put_file(str(s3_data.local / "part-005.parquet"), victim)
        s3_data.fs.invalidate_cache()


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


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_two_torchrun_ranks_and_their_workers_share_one_cache(
    s3_data: RemoteData, fault_proxy: MakeProxy, tmp_path: Path
) -> None:
    ranges: Counter[tuple[str, str]] = Counter()
    lock = threading.Lock()

    def record(request: Request) -> bool:  # every ranged GET, by object and range
        if request.ranged:
            with lock:
                ranges[(request.target.split("?", 1)[0], str(request.header("range")))] += 1
        return False  # (no faults)

    proxy = fault_proxy(match=record)
    config = tmp_path / "config.json"  # the credentials go in a file, not the command line
    config.touch(mode=0o600)
    options = {**s3_data.storage_options, "endpoint_url": proxy.endpoint_url}
    config.write_text(json.dumps({"url": s3_data.url, "storage_options": options}))
    spec = {
        "config": str(config),
        "cache_dir": str(tmp_path / "cache"),
        "epochs": 3,
        "batch_size": 250,
        "num_workers": 2,
        "out": str(tmp_path / "out.json"),
    }
    ranks, _ = run_script("read_cached.py", 2, spec, timeout=240)
    assert len(ranks) == 2
    for epoch in range(3):
        per_rank = [rank["epochs"][epoch] for rank in ranks]
        assert len(per_rank[0]) == len(per_rank[1])  # equal batches
        union = Counter(i for batches in per_rank for batch in batches for i in batch)
        assert union == Counter(s3_data.ids), f"epoch {epoch}"
        if epoch:  # a cached epoch: nothing from the store, on any rank or worker
            for rank in ranks:
                stats = rank["cache"][str(epoch)]
                assert (stats["misses"], stats["requests"], stats["bytes_from_store"]) == (0, 0, 0)
                assert stats["hits"] > 0
    # No range was downloaded twice, by any of the 2 ranks x 2 workers; each rank read the
    # footers of its share of the files at planning (sources.steps).
    assert ranges and max(ranges.values()) == 1, ranges.most_common(3)
    assert all(rank["planning"]["misses"] > 0 for rank in ranks)


def _write_formats(root: Path) -> dict[str, str]:
    """Rows with ids 0..599 in each format: format name -> folder under ``root``."""
    import pyarrow as pa
    import pyarrow.csv as pacsv
    import pyarrow.orc as orc

    from torch_dataloader_utils.webdataset.writer import ShardWriter

    folders = {}
    for name in ("csv", "json", "orc", "ipc", "webdataset"):
        (root / name).mkdir(parents=True)
        folders[name] = name
    for part in range(3):
        table = pa.table({"id": np.arange(part * 200, (part + 1) * 200), "x": np.ones(200)})
        pacsv.write_csv(table, root / "csv" / f"p{part}.csv")
        lines = "".join(f'{{"id": {i}, "x": 1.0}}\n' for i in table["id"].to_pylist())
        (root / "json" / f"p{part}.jsonl").write_text(lines)
        orc.write_table(table, root / "orc" / f"p{part}.orc", stripe_size=4096)
        with pa.ipc.new_file(root / "ipc" / f"p{part}.arrow", table.schema) as writer:
            for batch in table.to_batches(max_chunksize=50):
                writer.write_batch(batch)
    with ShardWriter(str(root / "webdataset" / "s-%03d.tar"), maxcount=250) as sink:
        for i in range(600):
            sink.write({"__key__": f"k{i:05d}", "id": i, "bin": bytes(i % 300)})
    return folders


@pytest.fixture(scope="module")
def s3_formats(s3_data: RemoteData, tmp_path_factory: pytest.TempPathFactory) -> str:
    local = tmp_path_factory.mktemp("formats")
    _write_formats(local)
    for path in sorted(local.rglob("*")):
        if path.is_file():
            s3_data.fs.put_file(str(path), f"{BUCKET}/formats/{path.relative_to(local)}")
    s3_data.fs.invalidate_cache()
    return f"s3://{BUCKET}/formats"


@pytest.mark.parametrize("fmt", ["csv", "json", "orc", "ipc", "webdataset"])
def test_every_format_reads_a_cached_epoch_without_the_store(
    s3_data: RemoteData, s3_formats: str, fault_proxy: MakeProxy, tmp_path: Path, fmt: str
) -> None:
    proxy = fault_proxy()
    storage = {**s3_data.storage_options, "endpoint_url": proxy.endpoint_url}
    loader = tdu.create_dataloader(
        f"{s3_formats}/{fmt}/",
        format=fmt,
        columns=["id"],
        batch_size=64,
        shuffle=True,
        num_workers=2,
        storage_options=storage,
        retries=FAST,
        cache_dir=tmp_path,
    )
    everything = Counter(range(600))
    assert _epoch(loader, 0) == everything
    proxy.reset_counts()
    assert _epoch(loader, 1) == everything
    assert proxy.counts["requests"] == 0, sorted(set(proxy.events))[:5]
    stats = loader.cache_epochs[1]
    assert (stats.misses, stats.requests) == (0, 0) and stats.hits > 0


def test_tdu_read_reports_what_the_cache_did_per_epoch(
    s3_data: RemoteData, fault_proxy: MakeProxy, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from torch_dataloader_utils.cli import main

    proxy = fault_proxy()
    storage = json.dumps({**s3_data.storage_options, "endpoint_url": proxy.endpoint_url})
    argv = ["read", s3_data.url, "--storage-options", storage, "--workers", "0"]
    assert main([*argv, "--cache-dir", str(tmp_path), "--epochs", "2"]) == 0
    lines = capsys.readouterr().out.splitlines()
    epochs = [line for line in lines if line.startswith("epoch ")]
    assert len(epochs) == 2 and all(f"{len(s3_data.ids):,} rows" in e for e in epochs)
    assert "misses 0," in epochs[1] and "0.0 MB from the store, 0 requests" in epochs[1]
    assert main(["cache", "--dir", str(tmp_path)]) == 0
    assert "ranges of 8 files" in capsys.readouterr().out


def test_a_mixture_shares_one_cache_across_its_sources(
    s3_data: RemoteData, fault_proxy: MakeProxy, tmp_path: Path
) -> None:
    proxy = fault_proxy()
    storage = {**s3_data.storage_options, "endpoint_url": proxy.endpoint_url}
    halves = [[s3_data.file_url(i) for i in range(4)], [s3_data.file_url(i) for i in range(4, 8)]]
    loader = tdu.create_dataloader(
        [tdu.Source(files, format="parquet") for files in halves],
        storage_options=storage,
        batch_size=500,
        shuffle=True,
        num_workers=2,
        cache_dir=tmp_path,
    )
    assert _epoch(loader, 0) == Counter(s3_data.ids)
    proxy.reset_counts()
    assert _epoch(loader, 1) == Counter(s3_data.ids)
    assert proxy.counts["requests"] == 0
    stats = loader.cache_epochs[1]
    assert (stats.misses, stats.requests) == (0, 0) and stats.hits >= 8
