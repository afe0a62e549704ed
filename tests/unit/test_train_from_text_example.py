"""``examples/train_from_text.py`` trains a tokenizer and a tiny Llama on raw text tokenized in
the loader, two epochs, every token once."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.timeout(180)

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "train_from_text.py"


def test_train_from_text_example(tmp_path: Path) -> None:
    command = [
        sys.executable,
        str(EXAMPLE),
        "--data",
        str(tmp_path),
        "--rows",
        "400",
        "--vocab",
        "600",
        "--seq-len",
        "128",
        "--batch-size",
        "4",
        "--steps",
        "3",
    ]
    done = subprocess.run(command, capture_output=True, text=True, timeout=170, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    out = done.stdout
    assert "1,200 documents" in out and "for a second loader (census kept)" in out
    counts = re.findall(r"epoch (\d): (\d+) tokens, each once: (\w+)", out)
    assert [(e, once) for e, _, once in counts] == [("0", "True"), ("1", "True")], out
    assert counts[0][1] == counts[1][1] and int(counts[0][1]) > 0
