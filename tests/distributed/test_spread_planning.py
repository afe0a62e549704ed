"""Planning spread over ranks (torchrun, gloo, CPU): each rank reads the footers of its share
of the files, and the plan is the one a single rank makes; a plan kept in ``cache_dir`` is
reused on restart without reading a footer, and a changed file is re-read alone."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.feather as feather
import pyarrow.orc as orc
import pyarrow.parquet as pq
import pytest

from tests.distributed.conftest import assert_exactly_once, ids_of, run_script

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

FILES = 13  # (3 ranks: shares of 4, 4 and 5)
ROWS = 37  # rows a file
FORMATS = ("parquet", "orc", "ipc", "csv")


@pytest.fixture(scope="module")
def formats_dir(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    out = {}
    for name in FORMATS:
        root = tmp_path_factory.mktemp(f"spread-{name}")
        for f in range(FILES):
            table = pa.table({"id": np.arange(ROWS) + ROWS * f, "x": np.arange(ROWS) * 0.5})
            path = root / f"part-{f:02d}.{name}"
            if name == "parquet":
                pq.write_table(table, path, row_group_size=10)
            elif name == "orc":
                orc.write_table(table, path)
            elif name == "ipc":
                feather.write_feather(table, path, compression="uncompressed")
            else:
                pacsv.write_csv(table, path)
        out[name] = root
    return out


def run(world: int, cases: list[dict[str, Any]], work: Path) -> dict[str, list[dict[str, Any]]]:
    spec = {"out": str(work / f"spread-{world}.json"), "cases": cases}
    result, _ = run_script("spread_plan.py", world, spec)
    return dict(result)


def test_each_rank_reads_its_share_and_the_plan_is_one_ranks(
    formats_dir: dict[str, Path], tmp_path: Path
) -> None:
    cases = [{"name": n, "data": str(formats_dir[n]), "format": n} for n in FORMATS]
    by_world = {world: run(world, cases, tmp_path) for world in (1, 2, 3)}
    for name in FORMATS:
        fingerprints = {r["fingerprint"] for w in by_world.values() for r in w[name]}
        assert len(fingerprints) == 1, name  # the same plan on 1, 2 and 3 ranks
        for world, results in by_world.items():
            ranks = results[name]
            every = ids_of(batch for rank in ranks for batch in rank["ids"])
            assert_exactly_once(every, range(FILES * ROWS), missing=FILES * ROWS % world)
            if name == "csv":  # planned together, on rank 0
                assert [r["plans"] for r in ranks] == [1] + [0] * (world - 1)
                continue
            read = Counter(f for r in ranks for f in r["facts"])
            assert sorted(read) == sorted(p.name for p in formats_dir[name].iterdir())
            assert set(read.values()) == {1}  # each file's footer read once, by one rank
            shares = [len(r["facts"]) for r in ranks]
            assert shares == [FILES * (k + 1) // world - FILES * k // world for k in range(world)]


def test_counting_is_shared_too_and_counts_as_one_rank(tmp_path: Path) -> None:
    """A filter's passing rows and a token budget's lengths are counted a share of the chunks
    a rank; the plan (which holds the counts) is one rank's."""
    data = tmp_path / "tokens"
    data.mkdir()
    for f in range(FILES):
        ids = np.arange(ROWS) + ROWS * f
        tokens = pa.array([[int(i)] * (int(i) % 5 + 1) for i in ids], pa.list_(pa.int64()))
        table = pa.table({"id": ids, "x": np.arange(ROWS) * 0.5, "tokens": tokens})
        pq.write_table(table, data / f"part-{f:02d}.parquet", row_group_size=10)
    cases = [
        {"name": "filter", "data": str(data), "filter": 7.0},
        {"name": "budget", "data": str(data), "budget": 40},
    ]
    by_world = {world: run(world, cases, tmp_path) for world in (1, 2, 3)}
    passing = [i for i in range(FILES * ROWS) if (i % ROWS) * 0.5 < 7.0]
    for name in ("filter", "budget"):
        assert len({r["fingerprint"] for w in by_world.values() for r in w[name]}) == 1, name
        for world, results in by_world.items():
            ranks = results[name]
            # Row groups of 10 of 37 rows; x < 7 (rows 0-13) prunes all but 2 a file.
            chunks = FILES * (2 if name == "filter" else 4)
            assert sum(r["counted"] for r in ranks) == chunks  # each chunk counted once ...
            assert all(r["counted"] for r in ranks)  # ... a share on every rank
            every = ids_of(batch for rank in ranks for batch in rank["ids"])
            if name == "filter":
                assert_exactly_once(every, passing, missing=len(passing) % world)
            else:  # (ids of rows, each once: a budget's batches are whole rows)
                assert set(every) <= set(range(FILES * ROWS)) and max(every.values()) == 1


def test_a_restart_reuses_the_kept_plan_and_rereads_a_changed_file_alone(
    formats_dir: dict[str, Path], tmp_path: Path
) -> None:
    data = tmp_path / "data"
    data.mkdir()
    for f in formats_dir["parquet"].iterdir():
        (data / f.name).write_bytes(f.read_bytes())
    cache = str(tmp_path / "cache")
    case = {"data": str(data), "cache_dir": cache}
    cases = [
        {"name": "first", **case},
        {"name": "restart", **case},
        {"name": "changed", **case, "change": "part-05.parquet"},
        {"name": "other columns", **case, "cache_dir": str(tmp_path / "other")},
    ]
    results = run(2, cases, tmp_path)
    assert sum(len(r["facts"]) for r in results["first"]) == FILES
    restart = results["restart"]
    assert [r["facts"] for r in restart] == [[], []]  # no footer read on any rank
    assert [r["schema"] for r in restart] == [0, 0]
    assert {r["fingerprint"] for r in restart} == {results["first"][0]["fingerprint"]}
    changed = results["changed"]
    assert sorted(f for r in changed for f in r["facts"]) == ["part-05.parquet"]
    assert sum(len(r["facts"]) for r in results["other columns"]) == FILES  # nothing kept there
    for name, ranks in results.items():
        every = ids_of(batch for rank in ranks for batch in rank["ids"])
        assert_exactly_once(every, range(FILES * ROWS), missing=FILES * ROWS % 2), name
