"""Planning on rank 0 that outlasts the process group's timeout (torchrun, gloo, CPU).

Rank 0's listing sleeps 10 s in a group made with a 5 s timeout (``scripts/slow_plan.py``): the
other ranks wait for the plan outside any collective (`sources.broadcast`), for up to
``TDU_PLAN_TIMEOUT`` seconds, and then every rank has the same plan; an error of rank 0's
planning still reaches every rank; a rank that waits past ``TDU_PLAN_TIMEOUT`` says so.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.distributed.conftest import ROWS, assert_exactly_once, ids_of, run_script, torchrun

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]

GROUP_TIMEOUT = 5  # seconds, the process group's
SLEEP = 10  # seconds rank 0's planning takes on top of the real work
WORLD = 2


@pytest.fixture(scope="module")
def slow_run(dataset_dir: Path, work_dir: Path) -> dict[str, list[dict[str, Any]]]:
    out = work_dir / "slow-plan.json"
    cases = [{"name": "ok"}, {"name": "missing", "data": str(dataset_dir / "missing")}]
    spec = {
        "data": str(dataset_dir),
        "out": str(out),
        "timeout": GROUP_TIMEOUT,
        "sleep": SLEEP,
        "cases": cases,
    }
    result, _ = run_script("slow_plan.py", WORLD, spec, env={"TDU_PLAN_TIMEOUT": "120"})
    return dict(result)


def test_every_rank_gets_the_plan_after_a_planning_longer_than_the_group_timeout(
    slow_run: dict[str, list[dict[str, Any]]],
) -> None:
    ranks = slow_run["ok"]
    assert all("error" not in rank for rank in ranks), ranks
    assert len({rank["fingerprint"] for rank in ranks}) == 1
    assert [rank["list_files"] for rank in ranks] == [1] + [0] * (WORLD - 1)  # rank 0 planned
    assert all(rank["seconds"] >= SLEEP for rank in ranks)  # the others waited for it
    every = ids_of(batch for rank in ranks for batch in rank["ids"])
    assert_exactly_once(every, range(ROWS), missing=ROWS % WORLD)


def test_an_error_of_a_slow_planning_reaches_every_rank(
    slow_run: dict[str, list[dict[str, Any]]],
) -> None:
    ranks = slow_run["missing"]
    assert [rank["error"] for rank in ranks] == ["StorageNotFoundError"] * WORLD
    assert all("missing" in rank["message"] for rank in ranks)
    assert all(rank["seconds"] >= SLEEP for rank in ranks)


def test_a_rank_waiting_past_the_plan_timeout_says_which_variable_to_raise(
    dataset_dir: Path, work_dir: Path
) -> None:
    spec = {
        "data": str(dataset_dir),
        "out": str(work_dir / "never.json"),
        "timeout": GROUP_TIMEOUT,
        "sleep": SLEEP,
        "cases": [{"name": "ok", "catch": False}],
    }
    launch = torchrun(
        "slow_plan.py",
        WORLD,
        "--spec",
        json.dumps(spec),
        env={"TDU_PLAN_TIMEOUT": "2"},
        check=False,
    )
    assert launch.returncode != 0
    assert "PlanTimeoutError" in launch.output
    assert "rank 0 did not finish planning the source within 2 s" in launch.output
    assert "TDU_PLAN_TIMEOUT" in launch.output
