"""Every file of the real-world corpus (``../shared/realworld-data``) read through the library.

Each file is read twice, with 0 and with 2 DataLoader workers (fork); the other settings
(output ``"arrow"`` or ``"torch"``, shuffle on or off, batches of 7 or 1,024 rows) alternate
between the two reads and between files, so every setting meets every format. Each read is
compared with the reference reader of the format on the whole file (`tests.corpus.cases`):

- the reference reads the file: the library delivers exactly its rows and values (as a
  multiset; torch output through the documented mapping), or refuses it *at planning* with
  `UnsupportedFileError`/`UnsupportedTypeError` naming the file, the column and why (a file
  that uses what the library does not read: duplicate column names, interval types pyarrow
  has no Python arrays for, gzip-compressed tar shards), or is one of `STRICTER` below;
- the reference fails: the library raises one of its own errors, naming the file.

A read runs in a child process (`tests.corpus.pool`) with a timeout: an abort or a hang fails
that case only.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
from collections.abc import Iterator
from typing import Any

import pytest

from tests.corpus.cases import ROOT, Case, all_cases
from tests.corpus.pool import Runner

# Files the reference reads although their footers contradict themselves; the library refuses
# them with a CorruptFileError rather than deliver what pyarrow does.
STRICTER = {
    # The footer gives 16 (and 2) rows and has no row groups, its Thrift with wrong wire types
    # that pyarrow's generated reader skips; pyarrow reads 0 rows and no columns.
    "arrow-testing/data/parquet/fuzzing/clusterfuzz-testcase-minimized-parquet-arrow-fuzz-"
    "4740205688193024": "footer with wrong Thrift wire types, no row groups",
    "arrow-testing/data/parquet/fuzzing/clusterfuzz-testcase-minimized-parquet-arrow-fuzz-"
    "5665099979423744": "footer with wrong Thrift wire types, no row groups",
    # A row group of 24 rows whose column chunk has no metadata: pyarrow reads 0 rows.
    "arrow-testing/data/parquet/fuzzing/clusterfuzz-testcase-minimized-parquet-arrow-fuzz-"
    "5697144926502912.fuzz": "a 24-row row group without column metadata (pyarrow: 0 rows)",
}
UNSUPPORTED = ("UnsupportedFileError", "UnsupportedTypeError")
# Seconds per read: planning, 2 workers started, the reference read and the comparison.
TIMEOUT = 120

CASES = all_cases()


def _configs(case: Case) -> list[dict[str, Any]]:
    """Two reads of ``case``: 0 and 2 workers, the other settings alternating (by the path's
    hash, so the choice is stable from run to run)."""
    bits = int(hashlib.sha256(case.relpath.encode()).hexdigest(), 16)
    output = ("arrow", "torch")[bits & 1]
    other = "torch" if output == "arrow" else "arrow"
    shuffle = bool(bits & 2)
    size = (7, 1024)[(bits >> 2) & 1]
    return [
        {"workers": 0, "output": output, "shuffle": shuffle, "batch_size": size},
        {"workers": 2, "output": other, "shuffle": not shuffle, "batch_size": 1031 - size},
    ]


@pytest.fixture(scope="module")
def runner() -> Iterator[Runner]:
    found = Runner()
    yield found
    found.close()


def test_the_corpus_is_there() -> None:
    """In CI the corpus must be found (never a silent skip); elsewhere its absence skips."""
    if not ROOT.is_dir() and os.environ.get("CI", "").lower() != "true":
        pytest.skip(f"no corpus at {ROOT}")
    assert len(CASES) > 500, f"{len(CASES)} files found under {ROOT}"


def judge(case: Case, verdict: dict[str, Any]) -> str | None:
    """What is wrong with ``verdict`` on ``case``, or None."""
    outcome = verdict.get("verdict")
    if outcome == "match":
        return None
    reference_ok = verdict.get("reference") == "ok"
    error = verdict.get("error") or {}
    if outcome == "refused":
        if not reference_ok:
            return None
        if error.get("type") in UNSUPPORTED and verdict.get("stage") == "planning":
            return None
        if case.relpath in STRICTER and error.get("type") == "CorruptFileError":
            return None
        return "refused a file the reference reads"
    if outcome == "read":
        return "read a file the reference refuses"
    return f"{outcome}"


@pytest.mark.parametrize("case", CASES, ids=[c.relpath for c in CASES])
def test_file_reads_as_the_reference_or_is_refused_with_a_reason(
    case: Case, runner: Runner
) -> None:
    problems = []
    for config in _configs(case):
        verdict = runner.run({"case": dataclasses.asdict(case), "config": config}, TIMEOUT)
        wrong = judge(case, verdict)
        if wrong is not None:
            problems.append(f"{config}: {wrong}: {verdict}")
    assert not problems, f"{case.relpath}:\n" + "\n".join(problems)
