"""The exposed wait `TabularDataLoader.metrics` reports is the time the training loop really
waited (issue 46): a loop that works a known time per step over S3 slowed by the latency proxy
in front of SeaweedFS, at 0 and 2 workers; every row still read once."""

from __future__ import annotations

import time
from collections import Counter

import pytest

import torch_dataloader_utils as tdu

from .conftest import MakeProxy, RemoteData

pytestmark = [pytest.mark.remote, pytest.mark.timeout(300)]

STEP = 0.02  # the loop's own work a step (a sleep)


@pytest.mark.parametrize("workers", [0, 2])
def test_the_reported_wait_is_the_time_the_loop_waited_for_a_slow_store(
    s3_data: RemoteData, fault_proxy: MakeProxy, workers: int
) -> None:
    proxy = fault_proxy(seed=5)
    options = {**s3_data.storage_options, "endpoint_url": proxy.endpoint_url}
    loader = tdu.create_dataloader(
        s3_data.url, batch_size=128, shuffle=True, num_workers=workers, storage_options=options
    )
    proxy.configure(slow_rate=1.0, delay=0.1, ranged_gets_only=True)  # every read 100 ms later
    ids: Counter[int] = Counter()
    work = 0.0
    start = time.perf_counter()
    for batch in loader:
        begun = time.perf_counter()
        ids.update(batch["id"].tolist())
        time.sleep(STEP)
        work += time.perf_counter() - begun
    wall = time.perf_counter() - start
    metrics = loader.metrics()
    waited = wall - work  # the wall clock outside the loop's own work
    assert ids == Counter(s3_data.ids)
    assert metrics["batches"] == len(loader)
    assert proxy.counts["slow"] > 0
    assert waited > 0.3  # (the store is the bottleneck here)
    assert abs(metrics["wait_s"] - waited) <= 0.1 * waited, (metrics["wait_s"], waited)
    assert metrics["read_s"] > 0 and metrics["wait_share"] == pytest.approx(
        metrics["wait_s"] / metrics["elapsed_s"]
    )
