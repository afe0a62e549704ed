"""Ray Train's ``TorchTrainer`` with 2 CPU workers runs ``examples/train_ray.py`` for real.

The loader is built in the driver and pickled into the workers through
``train_loop_config`` (before the fix every worker read every row); the first run stops 7
batches into epoch 0 and reports the loader's state in a Ray checkpoint; the second resumes it,
finishes epoch 0 and reads epoch 1, without set_epoch; once over rows, once over packed
sequences (``--packed``: every token once). Small data: Ray's start-up dominates (about 40 s a
run on 2 cores).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.packed_data import tokens_in
from tests.trainers.conftest import epoch_report, merge, read_ranks, run_example

pytestmark = [pytest.mark.slow, pytest.mark.timeout(400)]

ROWS = 2_000  # the example's data
BATCHES = ROWS // 2 // 50  # per rank and epoch


@pytest.mark.parametrize("packed", [False, True], ids=["rows", "packed"])
def test_driver_built_loader_reads_each_share_once_and_resumes_exactly(
    tmp_path: Path, packed: bool
) -> None:
    run_example("train_ray.py", "--out", str(tmp_path), *(["--packed"] * packed), timeout=360)
    first = read_ranks(tmp_path, "first")
    assert all(len(records) == 7 for records in first.values())
    rows, batches, missing = ROWS, BATCHES, 0
    if packed:  # the rows are tokens (ids unique), 3 sequences of 16 a batch, "drop" on 2 ranks
        rows = tokens_in(tmp_path / "data")
        missing = rows % 2
        batches = -(-(rows // 2) // (3 * 16))
    report = epoch_report(merge(first, read_ranks(tmp_path, "second")), rows)
    assert sorted(report) == [0, 1]
    for epoch in report.values():
        assert (epoch.seen, epoch.duplicated, epoch.missing) == (rows - missing, 0, missing)
        assert epoch.batches == (batches, batches)
    assert report[0].first != report[1].first
