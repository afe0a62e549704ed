"""Running the real trainers (Lightning, Ray Train, torchdata, mp.spawn) and judging what they read.

Each trainer test runs an example from ``examples/`` (the how-to's code) in a subprocess with a
timeout; every rank writes the row ids it read, per epoch and step, as JSON. `epoch_report`
turns those into rows seen, duplicated and missing per epoch, plus batches per rank.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.distributed.conftest import RANK_VARIABLES

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "examples"

# Lightning also reads NODE_RANK.
_RANK_VARIABLES = (*RANK_VARIABLES, "NODE_RANK")


def run_example(name: str, *args: str, timeout: float = 240) -> str:
    """Run ``examples/<name>`` with ``args``; its output, or a failure that shows it."""
    env = {k: v for k, v in os.environ.items() if k not in _RANK_VARIABLES}
    env.update(GLOO_SOCKET_IFNAME="lo", MASTER_ADDR="127.0.0.1", PYTHONUNBUFFERED="1")
    env.update(RAY_AUTH_MODE="disabled", RAY_USAGE_STATS_ENABLED="0")
    # One compute thread: the suite runs two test processes on two cores, and OpenMP threads
    # that spin on a core another process holds slowed an example's model steps ten-fold.
    env.setdefault("OMP_NUM_THREADS", "1")
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    try:
        done = subprocess.run(
            [sys.executable, str(EXAMPLES / name), *args],
            cwd=REPO,
            env=env,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
    except subprocess.TimeoutExpired as exc:
        raise AssertionError(f"{name} {args} hung for {timeout} s:\n{exc.output}") from exc
    output = done.stdout + done.stderr
    assert done.returncode == 0, f"{name} {args} exited {done.returncode}:\n{output[-6000:]}"
    return output


@dataclass(frozen=True)
class Epoch:
    """What the ranks read in one epoch."""

    seen: int  # distinct rows
    duplicated: int  # reads beyond the first, summed over rows
    missing: int  # rows of the data never read
    batches: tuple[int, ...]  # per rank
    first: tuple[int, ...]  # the first batch's ids of rank 0 (tells orders apart)


def read_ranks(out: Path, tag: str) -> dict[int, list[dict[str, Any]]]:
    """Per rank, its records ``{"epoch", "step", "ids"}`` (one per batch)."""
    files = sorted(out.glob(f"{tag}-rank*.json"))
    assert files, f"no rank wrote {tag}-rank*.json in {out}"
    return {int(f.stem.rsplit("rank", 1)[1]): json.loads(f.read_text()) for f in files}


def epoch_report(
    ranks: dict[int, list[dict[str, Any]]], rows: int, *, until_step: int | None = None
) -> dict[int, Epoch]:
    """Per epoch: rows seen, duplicated and missing, batches per rank.

    ``until_step``: only batches of global steps below it (what a checkpoint covered).
    """
    report: dict[int, Epoch] = {}
    epochs = sorted({r["epoch"] for records in ranks.values() for r in records})
    for epoch in epochs:
        counts: Counter[int] = Counter()
        batches = []
        first: tuple[int, ...] = ()
        for rank in sorted(ranks):
            mine = [
                r
                for r in ranks[rank]
                if r["epoch"] == epoch and (until_step is None or r["step"] < until_step)
            ]
            batches.append(len(mine))
            for record in mine:
                counts.update(record["ids"])
            if rank == 0 and mine:
                first = tuple(mine[0]["ids"])
        assert set(counts) <= set(range(rows)), "ids outside the data"
        report[epoch] = Epoch(
            seen=len(counts),
            duplicated=sum(counts.values()) - len(counts),
            missing=rows - len(counts),
            batches=tuple(batches),
            first=first,
        )
    return report


def merge(*reports: dict[int, list[dict[str, Any]]]) -> dict[int, list[dict[str, Any]]]:
    """The records of several runs of the same ranks, concatenated per rank."""
    merged: dict[int, list[dict[str, Any]]] = {}
    for report in reports:
        for rank, records in report.items():
            merged.setdefault(rank, []).extend(records)
    return merged
