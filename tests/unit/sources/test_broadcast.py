"""Waiting for rank 0's plan outside any collective (`sources.broadcast.Spread`), and the
progress log of a long planning (`fs.progress`). Real ranks are launched in
tests/distributed/test_planning."""

from __future__ import annotations

import logging
import threading
import time
from datetime import timedelta
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch.distributed as dist

from torch_dataloader_utils.errors import InvalidArgumentError, PlanTimeoutError
from torch_dataloader_utils.formats import Listing, ReadOptions
from torch_dataloader_utils.formats.parquet import ParquetFormat
from torch_dataloader_utils.fs import FileSystemSpec, list_files, progress
from torch_dataloader_utils.fs.progress import Progress
from torch_dataloader_utils.sources import broadcast
from torch_dataloader_utils.sources.broadcast import PLAN_TIMEOUT_ENV, Spread, plan_timeout


def test_the_plan_timeout_is_six_hours_unless_the_variable_says(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv(PLAN_TIMEOUT_ENV, raising=False)
    assert plan_timeout() == 6 * 3600
    monkeypatch.setenv(PLAN_TIMEOUT_ENV, " 90.5 ")
    assert plan_timeout() == 90.5


@pytest.mark.parametrize("value", ["ten", "0", "-5", "nan"])
def test_a_plan_timeout_that_is_no_positive_number_is_refused(
    monkeypatch: pytest.MonkeyPatch, value: str
) -> None:
    monkeypatch.setenv(PLAN_TIMEOUT_ENV, value)
    with pytest.raises(InvalidArgumentError, match=PLAN_TIMEOUT_ENV):
        plan_timeout()


def test_without_a_process_group_the_plan_is_made_here() -> None:
    assert not dist.is_initialized()
    spread = Spread(explicit=False)
    assert not spread.active
    assert spread.from_rank0(lambda: 42) == 42
    assert spread.share([1, 2, 3], lambda mine: [x * 2 for x in mine]).values() == [2, 4, 6]


def test_a_waiting_rank_returns_once_rank_0_sets_the_key(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(dist, "get_rank", lambda: 1)
    monkeypatch.setattr(broadcast, "_LOG_EVERY", 0.05)
    store = dist.HashStore()
    setter = threading.Timer(0.4, lambda: store.set("k", b"planned"))
    setter.start()
    start = time.monotonic()
    with caplog.at_level(logging.INFO, logger="torch_dataloader_utils"):
        broadcast._await(store, "k", timeout=30)
    assert 0.35 < time.monotonic() - start < 5
    waiting = [r.getMessage() for r in caplog.records if "waiting for rank 0" in r.getMessage()]
    assert waiting
    assert all(m.startswith("rank 1: ") and PLAN_TIMEOUT_ENV in m for m in waiting)


def test_a_rank_waiting_past_the_timeout_raises_naming_the_variable(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(dist, "get_rank", lambda: 3)
    store = dist.HashStore()
    start = time.monotonic()
    with pytest.raises(PlanTimeoutError, match=rf"rank 3: .* within 0 s; set {PLAN_TIMEOUT_ENV}"):
        broadcast._await(store, "never", timeout=0.3)
    assert time.monotonic() - start < 3


def test_a_single_rank_group_plans_without_waiting(tmp_path: Path) -> None:
    store = dist.FileStore(str(tmp_path / "store"), 1)
    dist.init_process_group("gloo", store=store, rank=0, world_size=1, timeout=timedelta(seconds=5))
    try:
        spread = Spread(explicit=False)
        assert not spread.active
        assert spread.from_rank0(lambda: "plan") == "plan"
    finally:
        dist.destroy_process_group()


# --- progress ----------------------------------------------------------------------------------


def test_progress_logs_done_total_and_rate_then_the_totals(
    caplog: pytest.LogCaptureFixture,
) -> None:
    found = Progress("footers read", 10, every=0.0)
    with caplog.at_level(logging.INFO, logger="torch_dataloader_utils"):
        found.add(4)
        found.add(6)
        found.finish()
    lines = [r.getMessage() for r in caplog.records]
    assert lines[0].startswith("planning: 4 of 10 footers read (40%)")
    assert lines[1].startswith("planning: 10 of 10 footers read (100%)")
    assert lines[2].startswith("planning: 10 footers read in ")
    assert all("a second" in line for line in lines)


def test_a_quick_step_logs_nothing(caplog: pytest.LogCaptureFixture) -> None:
    found = Progress("footers read", 10)
    with caplog.at_level(logging.INFO, logger="torch_dataloader_utils"):
        found.add(10)
        found.finish()
    assert not caplog.records


def test_planning_parquet_logs_its_progress(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    for i in range(600):  # more than one planning task
        pq.write_table(pa.table({"id": [i]}), tmp_path / f"part-{i:04d}.parquet")
    monkeypatch.setattr(progress, "LOG_EVERY", 0.0)
    fs = FileSystemSpec("file")
    files = list_files(str(tmp_path), fs)
    with caplog.at_level(logging.INFO, logger="torch_dataloader_utils.planning"):
        planned = ParquetFormat().plan(Listing.of(files), fs, ReadOptions())
    assert len(planned.chunks) == 600
    lines = [r.getMessage() for r in caplog.records]
    assert any(line.startswith("planning: 600 of 600 Parquet footers read") for line in lines)
    assert lines[-1].startswith("planning: 600 Parquet footers read in ")


@pytest.mark.parametrize("ranks", [1, 2, 64, 512, 4096, 100_000])
def test_waiting_ranks_learn_soon_and_spare_the_store(ranks: int) -> None:
    """Polls at the pauses `_pause` gives: a key set after ``t`` seconds is seen within about a
    tenth more (plus one shortest pause), never more than a second late; the polls of all the
    ranks together come at most ~6,400 a second (100 a second a rank for 64 ranks or fewer; one
    a second a rank past 6,400 ranks)."""
    shortest = broadcast._pause(0.0, ranks)
    for t in [0.005, 0.05, 0.39, 1.0, 2.5, 30.0, 600.0]:
        waited = 0.0
        while waited < t:
            waited += broadcast._pause(waited, ranks)
        assert waited - t <= min(0.1 * t + shortest, 1.0) + 1e-9
    polls, waited = 0, 0.0
    while waited < 60.0:
        pause = broadcast._pause(waited, ranks)
        assert 0.01 <= pause <= 1.0
        waited += pause
        polls += 1
    assert polls * ranks / 60.0 <= (100.0 * ranks if ranks <= 64 else max(6_400.0, ranks))
