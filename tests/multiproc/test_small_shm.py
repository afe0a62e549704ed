"""A container's small ``/dev/shm`` (Docker's and Kubernetes' default is 64 MiB): every row
exactly once with 2 and 4 workers and batches of 1,024 and 8,192 rows, for real: each scenario
runs in a private mount namespace whose ``/dev/shm`` is a small tmpfs (``unshare -m``, root).

- By default the workers' buffers are memfds, which /dev/shm's size does not bound.
- With ``TDU_SHARED_MEMORY=dev-shm`` they are in /dev/shm: bundles are sized from its room when
  workers start (logged once), and a bundle with no room goes through the pipe (logged once).
- A collate_fn's tensors (sent by torch through /dev/shm) go through the pipe without room.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

REPO = Path(__file__).resolve().parents[2]
ROWS = 100_000

pytestmark = [pytest.mark.slow, pytest.mark.timeout(400)]


def _namespaces_usable() -> str | None:
    """Why a private mount namespace cannot be made here, or None."""
    if shutil.which("unshare") is None:
        return "unshare (util-linux) is not installed"
    if os.geteuid() != 0:
        return "mounting a tmpfs on /dev/shm needs root"
    return None


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The issue's rows: an id, a 64-float embedding, token lists of 16-255 tokens (4 files)."""
    why = _namespaces_usable()
    if why is not None:
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(f"the /dev/shm tests must run in CI: {why}")
        pytest.skip(why)
    root = tmp_path_factory.mktemp("shm-data")
    rng = np.random.default_rng(0)
    lengths = rng.integers(16, 256, ROWS)
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
    values = rng.integers(0, 50_000, int(offsets[-1]), dtype=np.int32)
    table = pa.table(
        {
            "id": np.arange(ROWS),
            "embedding": pa.FixedSizeListArray.from_arrays(
                pa.array(rng.random(ROWS * 64, dtype=np.float32)), 64
            ),
            "tokens": pa.ListArray.from_arrays(pa.array(offsets), pa.array(values)),
        }
    )
    for i in range(4):
        part = table.slice(i * ROWS // 4, ROWS // 4)
        pq.write_table(part, root / f"part-{i}.parquet", row_group_size=5_000)
    return root


def in_small_shm(
    shm: str, data: Path, runs: list[list[Any]], env: dict[str, str] | None = None
) -> tuple[list[dict[str, Any]], str]:
    """Run the scenario in a private mount namespace with a ``shm``-sized /dev/shm."""
    spec = json.dumps({"data": str(data), "rows": ROWS, "runs": runs})
    inner = (
        f"mount -t tmpfs -o size={shm} tmpfs /dev/shm && exec {sys.executable} "
        f"-m tests.multiproc.small_shm_scenario '{spec}'"
    )
    done = subprocess.run(
        ["unshare", "-m", "--propagation", "private", "sh", "-c", inner],
        cwd=REPO,
        check=False,
        capture_output=True,
        text=True,
        timeout=360,
        env={**os.environ, **(env or {})},
    )
    assert done.returncode == 0, done.stderr[-5000:]
    results = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    assert len(results) == len(runs), done.stderr[-5000:]
    return results, done.stderr


def assert_exact(results: list[dict[str, Any]], shm_bytes: int) -> None:
    for result in results:
        assert "error" not in result, result
        assert result["shm"] == shm_bytes  # it did run in the small /dev/shm
        assert result["ids_ok"], result
        assert result["batches"] == -(-ROWS // result["batch_size"])
        assert result["left_in_shm"] == [], result  # nothing left behind in /dev/shm


RUNS = [[2, 1024, "fork", False], [4, 1024, "fork", False], [2, 8192, "fork", False]]
RUNS += [[4, 8192, "fork", False], [2, 1024, "spawn", False]]


def test_every_row_once_in_a_64_mib_dev_shm(data: Path) -> None:
    results, log = in_small_shm("64m", data, RUNS)
    assert_exact(results, 64 * 2**20)
    assert "through the pipe" not in log  # memfds: /dev/shm's size does not bound them


def test_in_dev_shm_bundles_are_sized_from_its_room_and_logged_once(data: Path) -> None:
    results, log = in_small_shm("64m", data, RUNS[:4], {"TDU_SHARED_MEMORY": "dev-shm"})
    assert_exact(results, 64 * 2**20)
    shrunk = [line for line in log.splitlines() if "bundles shrunk" in line]
    # Worker 0 of each loader tells, once: one line per loader at most.
    assert 1 <= len(shrunk) <= len(results), log[-3000:]
    assert "/dev/shm has" in shrunk[0] and "--shm-size" in shrunk[0]


def test_a_share_under_a_grain_shrinks_bundles_to_a_grain_not_to_nothing(data: Path) -> None:
    # 24 MiB for 2 workers' pools of 6: each buffer's share is just under a 1 MiB grain.
    results, log = in_small_shm("24m", data, RUNS[:1], {"TDU_SHARED_MEMORY": "dev-shm"})
    assert_exact(results, 24 * 2**20)
    (shrunk,) = [line for line in log.splitlines() if "bundles shrunk" in line]
    assert "free of 24.0 MiB: bundles shrunk from 16.0 MiB to 960 KiB for 2 worker" in shrunk


def test_without_room_in_dev_shm_batches_go_through_the_pipe(data: Path) -> None:
    runs = [[2, 8192, "fork", False], [2, 1024, "fork", True]]
    results, log = in_small_shm("1m", data, runs, {"TDU_SHARED_MEMORY": "dev-shm"})
    assert_exact(results, 2**20)
    assert "has no room for" in log and "go through the pipe" in log, log[-3000:]
    assert "(a collated batch)" in log  # the collate_fn's tensors too
