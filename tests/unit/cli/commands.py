"""Running the installed ``tdu`` script, and the one line of a refused command: shared by the
command-line tests (test modules import these from here, never from each other)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path


def tdu(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    """Run the installed ``tdu`` script (the console entry point users run)."""
    script = Path(sys.executable).with_name("tdu")
    assert script.exists(), f"no tdu script beside {sys.executable}: is the package installed?"
    return subprocess.run(
        [str(script), *args],
        capture_output=True,
        text=True,
        timeout=100,
        check=False,
        env={**os.environ, "TDU_DEBUG": "", **env},
    )


def assert_one_line(done: subprocess.CompletedProcess[str], command: str, *needles: str) -> None:
    assert done.returncode == 2, (done.returncode, done.stderr)
    lines = done.stderr.splitlines()
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith(f"tdu {command}: "), lines[0]
    for needle in needles:
        assert needle in lines[0], lines[0]
