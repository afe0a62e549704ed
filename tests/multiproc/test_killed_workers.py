"""A DataLoader worker killed mid-epoch with SIGKILL (what the out-of-memory killer sends).

Each case runs in its own Python process under a timeout, so a hang or a crash of the
interpreter fails the case instead of the run. In it, real worker processes (fork or spawn,
persistent or not) read real Parquet files; a worker is killed with ``os.kill`` after the main
process received ``k`` batches (or, for persistent workers, while they wait between epochs).
The case checks that:

(a) one `WorkerDiedError` comes out of the loop within seconds, naming the pid and the signal;
(b) the SAME loader object, given the state saved after the last batch received, finishes the
    epoch: the batches before and after are exactly an uninterrupted run's, every id once;
(c) nothing fires later: unrelated child processes that exit with an error or are killed, a
    garbage collection, and a second epoch raise nothing, and torch's registry of worker pids
    holds no failed worker.

The oracle is an uninterrupted fork run (the batches depend neither on the start method nor
on bundling: tests/multiproc/test_workers.py).
"""

from __future__ import annotations

import functools
import gc
import json
import os
import pickle
import signal
import subprocess
import sys
import time
import traceback
from collections import Counter
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import pytest
import torch

import torch_dataloader_utils as tdu
from tests.conftest import write_parquet

pytestmark = [pytest.mark.timeout(150)]

REPO = Path(__file__).resolve().parents[2]
SIZES = (250, 1000, 0, 333, 17)  # 1600 rows, ids 0..1599
ROWS = sum(SIZES)
BATCH = 20  # 80 batches: a worker killed early has most of its batches still to send
SEED = 7
CASE_TIMEOUT_S = 120
ERROR_WITHIN_S = 5.0

Batches = list[list[int]]


# --- the scenario, run in a process of its own -----------------------------------------------


def _record_pid(directory: str, worker_id: int) -> None:
    """A ``worker_init_fn`` (module level, so spawn can pickle it): the worker's pid on disk."""
    path = Path(directory, f"worker-{worker_id}")
    path.with_suffix(".tmp").write_text(str(os.getpid()))
    path.with_suffix(".tmp").replace(path)  # whole, for the main process to read


def _worker_pid(directory: Path, worker: int) -> int:
    path = directory / f"worker-{worker}"
    deadline = time.monotonic() + 60
    while not path.exists():  # a spawned worker may still be starting
        if time.monotonic() > deadline:
            raise TimeoutError(f"worker {worker} never started")
        time.sleep(0.01)
    return int(path.read_text())


def _make_loader(root: Path, **options: Any) -> tdu.TabularDataLoader:
    return tdu.create_dataloader(
        root, batch_size=BATCH, shuffle=True, shuffle_seed=SEED, num_workers=2, **options
    )


def _saved(loader: tdu.TabularDataLoader) -> dict[str, Any]:
    state: dict[str, Any] = pickle.loads(pickle.dumps(loader.state_dict()))
    return state


def _unrelated_children() -> None:
    """Children that end badly, as a training script's own subprocesses may: one exits with an
    error, one is killed. Their SIGCHLD must not be blamed on a DataLoader worker."""
    subprocess.run([sys.executable, "-c", "raise SystemExit(3)"], check=False)
    sleeper = subprocess.Popen(["sleep", "60"])
    sleeper.kill()
    sleeper.wait()
    time.sleep(0.2)  # let any SIGCHLD handler run
    gc.collect()  # the broken iterator's __del__, if anything still held it
    torch._C._error_if_any_worker_fails()  # torch's registry: no failed worker left in it


def run_case(spec: dict[str, Any]) -> dict[str, Any]:
    """Kill a worker at ``spec["kill_at"]`` = (epoch, batches received in it); see the module
    docstring. Returns what the test checks."""
    pids = Path(spec["pids"])
    loader = _make_loader(
        Path(spec["root"]),
        multiprocessing_context=spec["context"],
        persistent_workers=spec["persistent"],
        worker_init_fn=functools.partial(_record_pid, str(pids)),
        bundle_rows=spec["bundle_rows"],
        timeout=spec["timeout"],
    )
    kill_epoch, kill_after = spec["kill_at"]
    out: dict[str, Any] = {"epochs": [], "errors": [], "late_error": None}
    state = _saved(loader)  # the state after the last batch received
    killed_at = 0.0

    def kill() -> None:
        nonlocal killed_at
        pid = _worker_pid(pids, spec["victim"])
        out["victim_pid"] = pid
        os.kill(pid, signal.SIGKILL)
        killed_at = time.monotonic()

    for epoch in (0, 1):
        if epoch == 1:
            try:
                _unrelated_children()
            except Exception as exc:
                out["late_error"] = repr(exc)
        loader.set_epoch(epoch)
        received: Batches = []
        if (epoch, 0) == (kill_epoch, kill_after):
            kill()
        for attempt in range(2):
            try:
                for batch in loader:
                    received.append(batch["id"].tolist())
                    state = _saved(loader)
                    if attempt == 0 and (epoch, len(received)) == (kill_epoch, kill_after):
                        kill()
                break
            except Exception as exc:
                seconds = time.monotonic() - killed_at
                traceback.clear_frames(exc.__traceback__)
                out["errors"].append(
                    {
                        "type": type(exc).__name__,
                        "message": str(exc),
                        "seconds": seconds,
                        "cause": repr(exc.__cause__),  # torch's form of the death, if any
                        "received": len(received),
                        "state_now_is_last": _saved(loader) == state,
                    }
                )
                if attempt == 1:
                    raise
                loader.load_state_dict(state)  # the same loader object resumes
        out["epochs"].append(received)
    try:
        _unrelated_children()
    except Exception as exc:
        out["late_error"] = out["late_error"] or repr(exc)
    return out


def main() -> None:
    spec = json.loads(sys.argv[1])
    result = run_case(spec)
    Path(spec["result"]).write_text(json.dumps(result))


# --- the cases ---------------------------------------------------------------------------------


class Case(NamedTuple):
    context: str
    persistent: bool
    kill_at: tuple[int, int]  # (epoch, batches received in it); (1, 0): idle between epochs
    victim: int  # the worker killed
    bundle_rows: int  # 0: one batch per message
    timeout: float  # the loader's: a kill must not wait it out


CASES = [
    pytest.param(Case("fork", False, (0, 1), 1, 0, 60), id="fork-kill-after-1"),
    pytest.param(Case("fork", True, (0, 9), 0, 4 * BATCH, 60), id="fork-persistent-bundled"),
    pytest.param(Case("fork", True, (1, 0), 1, 0, 0), id="fork-persistent-kill-while-idle"),
    pytest.param(Case("spawn", False, (0, 6), 0, 0, 0), id="spawn", marks=pytest.mark.slow),
    pytest.param(
        Case("spawn", True, (0, 3), 1, 0, 60), id="spawn-persistent", marks=pytest.mark.slow
    ),
]


@pytest.fixture(scope="module")
def source(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[Batches]]:
    """The Parquet files, and the batches of epochs 0 and 1 of an uninterrupted run."""
    root = tmp_path_factory.mktemp("killed") / "data"
    start = 0
    for i, rows in enumerate(SIZES):
        ids = np.arange(start, start + rows)
        write_parquet(root / f"part-{i:03d}.parquet", ids, row_group_size=50)
        start += rows
    loader = _make_loader(root, multiprocessing_context="fork", timeout=60)
    expected = []
    for epoch in (0, 1):
        loader.set_epoch(epoch)
        expected.append([batch["id"].tolist() for batch in loader])
        assert Counter(i for batch in expected[-1] for i in batch) == Counter(range(ROWS))
    return root, expected


@pytest.mark.parametrize("case", CASES)
def test_killed_worker_is_one_error_then_the_same_loader_resumes(
    source: tuple[Path, list[Batches]], tmp_path: Path, case: Case
) -> None:
    root, expected = source
    (tmp_path / "pids").mkdir()
    spec = {
        **case._asdict(),
        "root": str(root),
        "pids": str(tmp_path / "pids"),
        "result": str(tmp_path / "result.json"),
    }
    code = "from tests.multiproc.test_killed_workers import main; main()"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), str(REPO / "src")])}
    try:
        run = subprocess.run(
            [sys.executable, "-W", "ignore::UserWarning", "-c", code, json.dumps(spec)],
            cwd=REPO,
            env=env,
            check=False,
            capture_output=True,
            text=True,
            timeout=CASE_TIMEOUT_S,
        )
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"the case hung for {CASE_TIMEOUT_S} s; its output:\n{exc.stderr!r}")
    assert run.returncode == 0, f"the case failed (rc {run.returncode}):\n{run.stderr[-6000:]}"
    result = json.loads((tmp_path / "result.json").read_text())

    # (a) one library error, soon, naming the worker and the signal
    (error,) = result["errors"]
    assert error["type"] == "WorkerDiedError", error
    assert f"pid {result['victim_pid']}" in error["message"]
    assert "killed by SIGKILL" in error["message"]
    assert "load_state_dict" in error["message"]
    assert error["seconds"] < ERROR_WITHIN_S, error
    if case.kill_at[1]:  # mid-epoch: the loader's state now is the one after the last batch
        assert error["state_now_is_last"]

    # (b) the same loader resumed: exactly the uninterrupted run, every id once
    for got, want in zip(result["epochs"], expected, strict=True):
        assert got == want
        assert Counter(i for batch in got for i in batch) == Counter(range(ROWS))

    # (c) nothing fired later
    assert result["late_error"] is None


def test_worker_died_error_is_a_runtime_error_with_one_message() -> None:
    error = tdu.WorkerDiedError("DataLoader worker 0 (pid 1) was killed by SIGKILL")
    assert isinstance(error, tdu.TorchDataloaderUtilsError)
    assert isinstance(error, RuntimeError)  # code that caught torch's RuntimeError still does
    assert type(error)(str(error)).args == error.args  # how torch re-raises worker errors
