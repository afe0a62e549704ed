"""Ray Train's ``TorchTrainer`` with 2 CPU workers runs ``examples/train_ray.py`` for real.

The loader is built in the driver and pickled into the workers through
``train_loop_config`` (before the fix every worker read every row); the first run stops 7
batches into epoch 0 and reports the loader's state in a Ray checkpoint; the second resumes it,
finishes epoch 0 and reads epoch 1, without set_epoch; over packed sequences (``--packed``:
every token once), whose state holds more than rows'. Small data: Ray's start-up dominates
(about 35 s a run on 2 cores), so rows through the same path (a loader built in the driver,
resumed in Ray's workers) are read once, in ``test_ray_one_plan.py``.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.packed_data import tokens_in
from tests.trainers.conftest import epoch_report, merge, read_ranks, run_example

pytestmark = [pytest.mark.slow, pytest.mark.timeout(400)]


def test_driver_built_loader_reads_each_share_once_and_resumes_exactly(tmp_path: Path) -> None:
    run_example("train_ray.py", "--out", str(tmp_path), "--packed", timeout=360)
    first = read_ranks(tmp_path, "first")
    assert all(len(records) == 7 for records in first.values())
    # The rows are tokens (ids unique), 3 sequences of 16 a batch, "drop" on 2 ranks.
    rows = tokens_in(tmp_path / "data")
    missing = rows % 2
    batches = -(-(rows // 2) // (3 * 16))
    report = epoch_report(merge(first, read_ranks(tmp_path, "second")), rows)
    assert sorted(report) == [0, 1]
    for epoch in report.values():
        assert (epoch.seen, epoch.duplicated, epoch.missing) == (rows - missing, 0, missing)
        assert epoch.batches == (batches, batches)
    assert report[0].first != report[1].first
