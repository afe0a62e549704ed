"""`TabularDataLoader.metrics` read for real (issue 46): the keys a loop logs, the exposed wait
of a fast source near zero, the stage split adding up to the wait, nothing of it in the state;
and ``num_workers="auto"``. Every test that reads checks the row ids."""

from __future__ import annotations

import logging
import statistics
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

import torch_dataloader_utils as tdu
from torch_dataloader_utils.cli import make_demo_dataset
from torch_dataloader_utils.metrics.clock import STAGES

pytestmark = [
    pytest.mark.timeout(300),
    pytest.mark.filterwarnings("ignore:This DataLoader will create:UserWarning"),
]

ROWS = 60_000


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_demo_dataset(tmp_path_factory.mktemp("metrics"), ROWS)


def ids_of(loader: Any, step: float = 0.0) -> Counter[int]:
    ids: Counter[int] = Counter()
    for batch in loader:
        ids.update(batch["id"].tolist())
        if step:
            time.sleep(step)
    return ids


@pytest.mark.parametrize("workers", [0, 2])
def test_metrics_are_a_flat_dict_of_floats_of_the_pass(demo: Path, workers: int) -> None:
    loader = tdu.create_dataloader(str(demo), batch_size=1024, num_workers=workers)
    before = loader.metrics()
    assert before["batches"] == 0 and before["wait_s"] == 0
    assert ids_of(loader) == Counter(range(ROWS))
    metrics = loader.metrics()
    assert all(isinstance(v, float) for v in metrics.values())
    assert metrics["batches"] == len(loader)
    assert 0 < metrics["wait_s"] <= metrics["elapsed_s"]
    assert metrics["wait_max_s"] >= metrics["wait_mean_s"] > 0
    for stage in STAGES:
        assert metrics[f"{stage}_s"] >= 0
    makers = ["main"] if not workers else [f"worker{w}" for w in range(workers)]
    assert sum(metrics[f"{m}_batches"] for m in makers) == len(loader)
    assert all(metrics[f"{m}_read_s"] > 0 and metrics[f"{m}_make_s"] > 0 for m in makers)
    if workers:
        assert metrics["queue_s"] > 0 and metrics["unpack_s"] > 0
        assert metrics["main_batches"] == 0
    assert metrics["planning_s"] > 0
    # A second pass starts again.
    loader.set_epoch(1)
    assert ids_of(loader) == Counter(range(ROWS))
    assert loader.metrics()["epoch"] == 1 and loader.metrics()["batches"] == len(loader)


def test_the_stage_split_adds_up_to_the_wait(demo: Path) -> None:
    """In one process the loop waits while the batch is read and made: the two stages are
    the wait, within 10%."""
    loader = tdu.create_dataloader(str(demo), batch_size=1024, num_workers=0, shuffle=True)
    loader.set_epoch(2)
    assert ids_of(loader) == Counter(range(ROWS))
    metrics = loader.metrics()
    stages = metrics["read_s"] + metrics["make_s"]
    assert abs(stages - metrics["wait_s"]) <= 0.1 * metrics["wait_s"], metrics


def test_a_fast_source_reports_a_wait_near_zero(demo: Path) -> None:
    """Workers ahead of a loop that works 10 ms a step: after each worker's first batch (the
    workers starting) the loop waits for a batch no more than it takes to receive one, a
    tenth of its step. The median only: the longest waits are the scheduler's (a few ms each
    when another process keeps both cores busy), so their sum or their 90th percentile measures
    the machine's load, not the loader."""
    loader = tdu.create_dataloader(str(demo), batch_size=1024, num_workers=2)
    start = time.perf_counter()
    assert ids_of(loader, step=0.01) == Counter(range(ROWS))
    wall = time.perf_counter() - start
    metrics = loader.metrics()
    each = list(loader._metrics.waits.each)
    assert metrics["wait_s"] >= sum(each)  # (and the pass's end: the workers stopping)
    after_first = each[2:]
    typical = statistics.median(after_first)
    assert typical < 0.1 * 0.01, (typical, sum(after_first), wall)


def test_nothing_of_the_metrics_is_in_the_state(demo: Path) -> None:
    loader = tdu.create_dataloader(str(demo), batch_size=1024, num_workers=0)
    first = loader.state_dict()
    ids = Counter[int]()
    for batch in loader:
        ids.update(batch["id"].tolist())
        break
    state = loader.state_dict()
    assert set(state) == set(first)
    text = repr(state)
    assert "wait" not in text and "clock" not in text


def test_auto_workers_logs_its_reason_and_reads_every_row(
    demo: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.INFO, logger="torch_dataloader_utils"):
        loader = tdu.create_dataloader(str(demo), batch_size=1024, num_workers="auto")
    said = [r.getMessage() for r in caplog.records if "num_workers='auto'" in r.getMessage()]
    assert len(said) == 1 and f": {loader.num_workers} (" in said[0], said
    assert "cores" in said[0]
    assert ids_of(loader) == Counter(range(ROWS))
    with pytest.raises(tdu.InvalidArgumentError, match='num_workers must be an int or "auto"'):
        tdu.create_dataloader(str(demo), num_workers="many")


def test_a_numpy_integer_is_a_worker_count(demo: Path) -> None:
    import numpy as np

    loader = tdu.create_dataloader(str(demo), batch_size=1024, num_workers=np.int64(0))
    assert loader.num_workers == 0
    assert ids_of(loader) == Counter(range(ROWS))


def test_forked_workers_of_a_later_pass_record_in_their_own_rows(demo: Path) -> None:
    """Workers forked again for a second pass (not persistent) inherit the main process's
    clock object: each still records in its own row, not in the main process's."""
    loader = tdu.create_dataloader(
        str(demo), batch_size=1024, num_workers=2, multiprocessing_context="fork"
    )
    for epoch in (0, 1):
        loader.set_epoch(epoch)
        assert ids_of(loader) == Counter(range(ROWS))
        metrics = loader.metrics()
        assert metrics["main_batches"] == 0 and metrics["main_read_s"] == 0
        assert metrics["worker0_batches"] + metrics["worker1_batches"] == len(loader)
