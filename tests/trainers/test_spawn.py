"""``torch.multiprocessing.spawn`` with a loader built (and planned) in the parent.

The parent has no process group and no ``RANK``; before the fix every rank read all rows.
"""

from __future__ import annotations

import pytest

from tests.trainers.conftest import run_example

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]


def test_loader_built_in_the_parent_reads_each_rank_s_share() -> None:
    output = run_example("train_mp_spawn.py", "--ranks", "2", timeout=200)
    for epoch in (0, 1):
        line = f"epoch {epoch}: rows seen 4000, duplicated 0, missing 0, batches per rank [32, 32]"
        assert line in output, output[-3000:]
    assert "a new order each epoch" in output
