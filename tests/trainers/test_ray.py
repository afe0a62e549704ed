"""Ray Train's ``TorchTrainer`` with 2 CPU workers runs ``examples/train_ray.py`` for real.

The loader is built in the driver and pickled into the workers through
``train_loop_config`` (before the fix every worker read every row); the first run stops 7
batches into epoch 0 and reports the loader's state in a Ray checkpoint; the second resumes it,
finishes epoch 0 and reads epoch 1, without set_epoch. One module, small data: Ray's start-up
dominates (about a minute on 2 cores).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.trainers.conftest import epoch_report, merge, read_ranks, run_example

pytestmark = [pytest.mark.slow, pytest.mark.timeout(400)]

ROWS = 2_000  # the example's data
BATCHES = ROWS // 2 // 50  # per rank and epoch


def test_driver_built_loader_reads_each_share_once_and_resumes_exactly(tmp_path: Path) -> None:
    run_example("train_ray.py", "--out", str(tmp_path), timeout=360)
    first = read_ranks(tmp_path, "first")
    assert all(len(records) == 7 for records in first.values())
    report = epoch_report(merge(first, read_ranks(tmp_path, "second")), ROWS)
    assert sorted(report) == [0, 1]
    for epoch in report.values():
        assert (epoch.seen, epoch.duplicated, epoch.missing) == (ROWS, 0, 0)
        assert epoch.batches == (BATCHES, BATCHES)
    assert report[0].first != report[1].first
