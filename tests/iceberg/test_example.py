"""``examples/train_iceberg.py`` trains two epochs on a local Iceberg table, every row once."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.timeout(120)

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "train_iceberg.py"


def test_train_iceberg_example(tmp_path: Path) -> None:
    command = [sys.executable, str(EXAMPLE), "--dir", str(tmp_path), "--rows", "1500"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=100, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    out = done.stdout
    assert "table demo.events at snapshot" in out and "3000 rows in" in out
    for epoch in range(2):
        assert f"epoch {epoch}: 3000 rows, each read once: True" in out
    assert (tmp_path / "catalog.db").is_file()
