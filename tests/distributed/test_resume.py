"""Kill a DDP job in the middle of an epoch and resume it from rank 0's saved state.

Two launches are killed hard (2 and 3 ranks, ``scripts/kill_resume.py``): rank 0 saves its
``state_dict()`` after ``k`` batches, then dies with ``os._exit`` while its workers and the other
ranks are busy. Two launches then resume those states, on the same topology and on others
(2 -> 3 and 3 -> 2 ranks, 0 -> 2 workers). What was read before the kill and what is read after
must be every row of the epoch exactly once, less only the rows each topology's "drop" policy
leaves out; on the same topology, the resumed batches are an uninterrupted run's batches. The
states named ``*p`` are of packed sequences (ids are tokens): resumed exactly and elastically.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.distributed.conftest import (
    BATCH,
    PACKED_BATCH,
    PACKING,
    ROWS,
    Launch,
    PackedData,
    assert_exactly_once,
    ids_of,
    run_script,
)

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]

EPOCH = 1
# Saved states: (ranks, workers) and batches per rank read before the kill. The last of each
# launch is the one that dies with its workers running.
KILLED = {
    2: [("2x0", 0, 4), ("2x2p", 2, 9), ("2x2", 2, 5)],
    3: [("3x0", 0, 2), ("3x0p", 0, 7), ("3x2", 2, 3)],
}
TOPOLOGY = {name: (ranks, workers) for ranks, cases in KILLED.items() for name, workers, _ in cases}
STEPS = {name: k for cases in KILLED.values() for name, _, k in cases}
# Resumes: saved state -> (ranks, workers).
RESUMED = {
    2: [("2x2", 2), ("3x2", 2), ("2x0", 2), ("2x2p", 2), ("3x0p", 2)],
    3: [("3x0", 0), ("2x0", 0), ("2x2", 2), ("3x0p", 0), ("2x2p", 0)],
}
RESUMES = [
    f"{state}->{ranks}x{workers}" for ranks, cases in RESUMED.items() for state, workers in cases
]
SAME_TOPOLOGY = [r for r in RESUMES if r.split("->")[0].rstrip("p") == r.split("->")[1]]

Ranks = list[dict[str, Any]]


@dataclass(frozen=True)
class Jobs:
    killed: dict[str, Ranks]  # per saved state: each old rank's ids before and its state
    launches: dict[int, Launch]  # the killed launches, by ranks
    resumed: dict[str, Ranks]  # per resume: each new rank's batches


def _rows(state: str, packed: PackedData) -> int:
    """Ids of the data a state was saved over: rows, or (``*p``) tokens."""
    return packed.tokens if state.endswith("p") else ROWS


@pytest.fixture(scope="module")
def jobs(dataset_dir: Path, packed_dataset: PackedData, work_dir: Path) -> Jobs:
    states = work_dir / "states"
    states.mkdir()
    packed = {
        "packed": str(packed_dataset.root),
        "packing": PACKING,
        "packed_batch": PACKED_BATCH,
    }
    killed: dict[str, Ranks] = {}
    launches: dict[int, Launch] = {}
    for ranks, cases in KILLED.items():
        spec = {
            "mode": "kill",
            "data": str(dataset_dir),
            "out": str(work_dir / f"killed-{ranks}.json"),
            "states": str(states),
            "epoch": EPOCH,
            "batch_size": BATCH,
            "cases": [{"name": n, "num_workers": w, "k": k} for n, w, k in cases],
            **packed,
        }
        result, launches[ranks] = run_script("kill_resume.py", ranks, spec, check=False)
        killed.update(result)
    resumed: dict[str, Ranks] = {}
    for ranks, cases in RESUMED.items():
        spec = {
            "mode": "resume",
            "data": str(dataset_dir),
            "out": str(work_dir / f"resumed-{ranks}.json"),
            "batch_size": BATCH,
            "cases": [
                {
                    "name": f"{state}->{ranks}x{workers}",
                    "state": str(states / f"{state}.pt"),
                    "num_workers": workers,
                }
                for state, workers in cases
            ],
            **packed,
        }
        result, _ = run_script("kill_resume.py", ranks, spec)
        resumed.update(result)
    return Jobs(killed, launches, resumed)


def _ids(ranks: Ranks, key: str) -> list[int]:
    return [i for rank in ranks for batch in rank[key] for i in batch]


def test_the_killed_jobs_died_after_every_rank_saved_the_same_state(jobs: Jobs) -> None:
    for ranks, launch in jobs.launches.items():
        assert launch.returncode != 0, launch.output[-5000:]
        assert re.search(r"exitcode\s*:\s*3\b", launch.output), launch.output[-5000:]
        for name, _, k in KILLED[ranks]:
            old = jobs.killed[name]
            states = [rank["state"] for rank in old]
            assert all(state == states[0] for state in states)  # any rank's state resumes all
            assert states[0]["epoch"] == EPOCH and states[0]["batches"] == k
            assert [len(rank["before"]) for rank in old] == [k] * ranks


@pytest.mark.parametrize("resume", RESUMES)
def test_before_and_after_the_kill_every_id_once(
    jobs: Jobs, resume: str, packed_dataset: PackedData
) -> None:
    state, topology = resume.split("->")
    rows = _rows(state, packed_dataset)
    old_ranks, _ = TOPOLOGY[state]
    new_ranks, new_workers = (int(n) for n in topology.split("x"))
    before = _ids(jobs.killed[state], "before")
    after = _ids(jobs.resumed[resume], "after")
    # The old topology's "drop" left out ROWS % old_ranks rows; an elastic resume deals the
    # rows its streams had not read to the new ranks, and "drop" leaves out that remainder.
    left = rows - rows % old_ranks - len(before)
    elastic = TOPOLOGY[state] != (new_ranks, new_workers)
    dropped_after = left % new_ranks if elastic else 0
    assert len(after) == left - dropped_after
    assert_exactly_once(
        ids_of([before, after]), range(rows), missing=rows % old_ranks + dropped_after
    )


@pytest.mark.parametrize("resume", RESUMES)
def test_after_a_resume_ranks_have_equal_batches(jobs: Jobs, resume: str) -> None:
    new = jobs.resumed[resume]
    counts = [len(rank["after"]) for rank in new]
    assert counts[0] > 0 and counts == [counts[0]] * len(new)
    rows = [sum(len(b) for b in rank["after"]) for rank in new]
    assert rows == [rows[0]] * len(new)


@pytest.mark.parametrize("resume", SAME_TOPOLOGY)
def test_same_topology_resume_continues_the_uninterrupted_run(jobs: Jobs, resume: str) -> None:
    state, _ = resume.split("->")
    k = STEPS[state]
    for old, new in zip(jobs.killed[state], jobs.resumed[resume], strict=True):
        assert new["reference"][:k] == old["before"]  # the killed job read the same batches
        assert new["after"] == new["reference"][k:]


@pytest.mark.parametrize("resume", RESUMES)
def test_the_epoch_after_a_resume_is_a_fresh_epoch(
    jobs: Jobs, resume: str, packed_dataset: PackedData
) -> None:
    new = jobs.resumed[resume]
    for rank in new:
        assert rank["next"] == rank["reference_next"]
    rows = _rows(resume.split("->", maxsplit=1)[0], packed_dataset)
    every = ids_of(batch for rank in new for batch in rank["next"])
    assert_exactly_once(every, range(rows), missing=rows % len(new))
