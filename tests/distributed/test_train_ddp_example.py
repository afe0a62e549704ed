"""``examples/train_ddp.py`` runs under torchrun with 2 ranks, stops early, and resumes.

The example counts how often each row (its ``id``) was read in each epoch, across ranks and
across the resume, and prints it; the test reads those lines.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.distributed.conftest import REPO, torchrun

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]

EXAMPLE = REPO / "examples" / "train_ddp.py"
ROWS = 10_000  # the example's generated data: 4 files of 2,500 rows
BATCH = 128
RANKS = 2
SAVE_EVERY = 10
STOP = 25  # steps before the first run stops: its last checkpoint is at step 20


def _epochs(output: str) -> dict[int, tuple[int, int, int, int]]:
    """Per epoch: rows read in this run, and rows of the epoch read once, more often, never."""
    pattern = (
        r"epoch (\d+): (\d+) rows in this run; rows of the epoch read once: (\d+), "
        r"more often: (\d+), never: (\d+)"
    )
    return {
        int(m[0]): (int(m[1]), int(m[2]), int(m[3]), int(m[4])) for m in re.findall(pattern, output)
    }


def test_train_ddp_stops_and_resumes_reading_every_row_once(tmp_path: Path) -> None:
    paths = ["--data", str(tmp_path / "data"), "--checkpoint", str(tmp_path / "ckpt.pt")]
    options = [*paths, "--batch-size", str(BATCH), "--save-every", str(SAVE_EVERY)]
    first = torchrun(EXAMPLE, RANKS, *options, "--max-steps", str(STOP), timeout=180)
    assert f"stopping at step {STOP}" in first.output
    assert (tmp_path / "data").is_dir() and (tmp_path / "ckpt.pt").is_file()
    assert _epochs(first.output) == {}  # stopped inside epoch 0

    second = torchrun(EXAMPLE, RANKS, *options, "--resume", timeout=180)
    saved = STOP - STOP % SAVE_EVERY
    assert f"resumed from step {saved} in epoch 0" in second.output
    rest = ROWS - saved * BATCH * RANKS  # the batches after the checkpoint
    assert _epochs(second.output) == {0: (rest, ROWS, 0, 0), 1: (ROWS, ROWS, 0, 0)}
