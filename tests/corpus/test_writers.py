"""Parquet files other writers make (`tests.corpus.writers`: fastparquet, duckdb, polars, and
footers edited to hold empty structs), read through the library as the corpus test reads its
files: twice (0 and 2 workers, Arrow and torch output, shuffle and batch size alternating), in
the corpus runner's child process, each read compared row by row and value by value with
pyarrow's ``pq.read_table`` (`tests.corpus.test_corpus.judge`).

Stricter than the corpus's rules: a file pyarrow reads must be read, never refused, and a file
a writer wrote with rows must deliver them; the one file pyarrow cannot read (an empty struct
beside other fields) must be refused at planning with `UnsupportedFileError` naming the file
and the column.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.corpus.cases import Case
from tests.corpus.pool import Runner
from tests.corpus.test_corpus import TIMEOUT, _configs, judge
from tests.corpus.writers import Written, files, write_all

FILES = files()


@pytest.fixture(scope="module")
def runner() -> Iterator[Runner]:
    found = Runner()
    yield found
    found.close()


@pytest.fixture(scope="module")
def written(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return write_all(tmp_path_factory.mktemp("writers"))


def test_every_writer_writes_every_kind_of_file() -> None:
    names = [w.name for w in FILES]
    for writer in ("fastparquet", "duckdb", "polars"):
        assert f"{writer}-empty" in names
        assert sum(n.startswith(writer + "-") for n in names) >= 3, names


@pytest.mark.parametrize("w", FILES, ids=[w.name for w in FILES])
def test_a_file_another_writer_made_reads_as_pyarrow_reads_it(
    w: Written, written: dict[str, Path], runner: Runner
) -> None:
    path = written[w.name]
    case = Case(str(path), "parquet")
    outputs = set()
    for config in _configs(case):
        verdict = runner.run({"case": dataclasses.asdict(case), "config": config}, TIMEOUT)
        wrong = judge(case, verdict)
        assert wrong is None, f"{w.name} {config}: {wrong}: {verdict}"
        outputs.add(config["output"])
        if w.refused:
            error = verdict["error"]
            assert verdict["verdict"] == "refused" and verdict["stage"] == "planning", verdict
            assert verdict["reference"] != "ok", verdict
            assert error["type"] == "UnsupportedFileError", verdict
            for named in (path.name, repr(w.refused), "empty struct"):
                assert named in error["message"], verdict
            continue
        assert verdict["verdict"] == "match", f"{w.name} {config}: {verdict}"
        assert verdict["rows"] == w.rows, verdict
    assert outputs == {"arrow", "torch"}
