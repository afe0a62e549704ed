"""The bad-input corpus (`tests.corpus.bad_input`): every damaged file read with 0 and 2 workers
in the corpus runner's child process; each read delivers exactly the reference's rows or a
library error naming the file, and a file changed after planning is always refused."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.corpus.bad_input import FORMATS, TIMEOUT, BadCase, cases, problem, request
from tests.corpus.pool import Runner

CASES = cases()


@pytest.fixture(scope="module")
def runner() -> Iterator[Runner]:
    found = Runner()
    yield found
    found.close()


def test_every_format_meets_every_kind_of_damage() -> None:
    kinds = {"truncated", "bit flip", "after planning"}
    for fmt in FORMATS:
        names = " | ".join(c.name for c in CASES if c.fmt == fmt)
        assert all(kind in names for kind in kinds), (fmt, names)


@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("case", CASES, ids=[f"{c.fmt}-{c.name}" for c in CASES])
def test_damaged_file_is_read_as_pyarrow_reads_it_or_refused_naming_it(
    runner: Runner, tmp_path: Path, case: BadCase, workers: int
) -> None:
    output = "torch" if workers else "arrow"
    verdict = runner.run(request(case, tmp_path, workers, output), TIMEOUT)
    assert problem(case, verdict) is None, problem(case, verdict)
