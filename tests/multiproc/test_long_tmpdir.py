"""Workers under a ``TMPDIR`` too long for a UNIX socket's path (a scheduler's or a test's
folder): each pooled buffer's descriptor reaches the main process through multiprocessing's
socket there, whose bind failed in the queue's feeder thread; the message was dropped and the
loader waited forever. Run in its own process with a timeout, fork and spawn, every row once."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

from tests.conftest import make_table

SCRIPT = """
import json, sys
import torch_dataloader_utils as tdu
loader = tdu.create_dataloader(
    sys.argv[1], batch_size=64, shuffle=True, num_workers=2, multiprocessing_context=sys.argv[2]
)
print(json.dumps(sorted(i for b in loader for i in b["id"].tolist())))
"""


@pytest.mark.parametrize("context", ["fork", "spawn"])
def test_workers_deliver_every_row_under_a_long_tmpdir(tmp_path: Path, context: str) -> None:
    pq.write_table(make_table(np.arange(3000)), tmp_path / "data.parquet", row_group_size=250)
    long = tmp_path / ("t" * 40) / ("m" * 40)
    long.mkdir(parents=True)
    assert len(str(long)) + len("/pymp-xxxxxxxx/listener-xxxxxxxx") > 107
    env = {**os.environ, "TMPDIR": str(long)}
    try:
        done = subprocess.run(
            [sys.executable, "-c", SCRIPT, str(tmp_path / "data.parquet"), context],
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
    except subprocess.TimeoutExpired as exc:
        raise AssertionError(f"the loader hung under TMPDIR={long}:\n{exc.stderr}") from exc
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads(done.stdout.splitlines()[-1]) == list(range(3000))
