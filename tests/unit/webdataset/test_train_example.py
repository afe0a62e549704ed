"""``examples/train_webdataset.py`` writes shards, trains two epochs, every sample once."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.timeout(120)

EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "train_webdataset.py"


def test_train_webdataset_example() -> None:
    command = [sys.executable, str(EXAMPLE), "--samples", "1500", "--per-shard", "400"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=100, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    out = done.stdout
    assert "train-{000000..000003}.tar" in out and "4 chunks, 1500 samples" in out
    for epoch in range(2):
        assert f"epoch {epoch}: 1500 samples, each read once: True" in out
