"""A process that planned a CSV source exits 0 (issue 28): pyarrow's CSV reader read ahead on
Arrow's IO threads, and a Python-owned input released there after the interpreter began to exit
aborted it (SIGABRT, exit 134, "terminate called without an active exception"), ~1 run in 15
under load. Plan-and-exit runs in subprocesses here, beside a busy loop, and every exit code
must be 0."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.csv as pacsv

RUNS = 16
PARALLEL = 2
BUDGET_S = 90  # each run is ~2 s on 2 loaded cores (importing torch)

SCRIPT = """
import sys
import torch_dataloader_utils as tdu
ds = tdu.StructuredDataset(sys.argv[1], "csv")
assert len(ds.plan.chunks) == 3, ds
"""


def test_plan_and_exit_never_aborts(tmp_path: Path) -> None:
    for i in range(3):
        ids = list(range(i * 100, i * 100 + 100))
        pacsv.write_csv(pa.table({"id": ids, "x": [str(v) for v in ids]}), tmp_path / f"{i}.csv")
    busy = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    codes: list[tuple[int, str]] = []
    started = time.monotonic()
    try:
        for _ in range(0, RUNS, PARALLEL):
            runs = [
                subprocess.Popen(
                    [sys.executable, "-c", SCRIPT, str(tmp_path)],
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.PIPE,
                )
                for _ in range(PARALLEL)
            ]
            for run in runs:
                _, err = run.communicate(timeout=BUDGET_S)
                codes.append((run.returncode, err.decode(errors="replace")[-300:]))
            if time.monotonic() - started > BUDGET_S:
                break
    finally:
        busy.kill()
        busy.wait()
    assert codes and all(code == 0 for code, _ in codes), [c for c in codes if c[0]]
