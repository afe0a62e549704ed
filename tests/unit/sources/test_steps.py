"""Planning a source in steps (`sources.steps.plan_files`): over two ranks played here in turn,
each step where it runs, the plan is the one a single process makes; each file's facts and each
chunk's counts are read once, by one rank. Real ranks: tests/distributed/test_planning."""

from __future__ import annotations

import pickle
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from torch_dataloader_utils.formats import get_format
from torch_dataloader_utils.fs import FileSystemSpec
from torch_dataloader_utils.sources.broadcast import Gathered, Spread
from torch_dataloader_utils.sources.files import Planned
from torch_dataloader_utils.sources.kept import KeptPlans
from torch_dataloader_utils.sources.steps import plan_files

T = TypeVar("T")
U = TypeVar("U")
FILES, ROWS = 5, 30
FS = FileSystemSpec("file")


class TwoRanks(Spread):
    """A process group of two ranks, played here: what rank 0 makes crosses pickle as a
    broadcast would; each share's work is done for each rank, in rank order."""

    def __init__(self) -> None:
        self.active, self.rank, self.world_size = True, 0, 2
        self.shares: list[list[list[Any]]] = []

    def from_rank0(self, make: Callable[[], T]) -> T:
        value: T = pickle.loads(pickle.dumps(make()))
        return value

    def share(self, items: Sequence[T], work: Callable[[Sequence[T]], list[U]]) -> Gathered:
        n = len(items)
        parts = [items[: n // 2], items[n // 2 :]]
        self.shares.append([list(p) for p in parts])
        return Gathered([("ok", work(p)) for p in parts])


@pytest.fixture
def data(tmp_path: Path) -> str:
    root = tmp_path / "data"
    root.mkdir()
    rng = np.random.default_rng(3)
    for f in range(FILES):
        docs = [rng.integers(0, 100, int(rng.integers(0, 6))).tolist() for _ in range(ROWS)]
        table = pa.table(
            {"id": np.arange(ROWS) + ROWS * f, "x": rng.integers(0, 10, ROWS), "tokens": docs}
        )
        pq.write_table(table, root / f"part-{f}.parquet", row_group_size=7)
    return str(root)


def plan(data: str, spread: Spread, kept: KeptPlans | None = None, **options: Any) -> Planned:
    asked: dict[str, Any] = {
        "columns": None,
        "filters": None,
        "partitioning": None,
        "split_bytes": None,
        "split_rows": None,
        **options,
    }
    fmt = get_format("parquet")
    return plan_files(data, fmt, FS, spread=spread, kept=kept, cache=None, **asked)


def listed(values: Any) -> list[int] | None:
    return None if values is None else [int(v) for v in values]


@pytest.mark.parametrize(
    "options",
    [
        {},
        {"filters": pc.field("x") > 3},
        {"tokens": "tokens", "eos": True},
        {"lengths": "tokens", "filters": pc.field("x") < 8, "split_rows": 10},
    ],
    ids=["plain", "filter", "tokens", "lengths"],
)
def test_two_ranks_plan_what_one_process_plans(data: str, options: dict[str, Any]) -> None:
    alone = plan(data, Spread(explicit=True), **options)
    ranks = TwoRanks()
    spread = plan(data, ranks, **options)
    assert spread.plan.fingerprint == alone.plan.fingerprint
    assert listed(spread.plan.filtered_rows) == listed(alone.plan.filtered_rows)
    assert spread.chunk_tokens == alone.chunk_tokens
    assert listed(spread.row_lengths) == listed(alone.row_lengths)
    assert replace(spread.read_options, filter=None) == replace(alone.read_options, filter=None)
    assert spread.decoded_row_bytes == alone.decoded_row_bytes
    # Every file's facts read once (a share each); the chunks counted once, when counted.
    files, *counted = ranks.shares
    assert sorted(i for part in files for i in part) == list(range(FILES))
    assert len(counted) == (1 if options else 0)
    for parts in counted:
        assert sorted(i for part in parts for i in part) == list(range(len(alone.plan.chunks)))


def test_a_kept_plan_is_the_plan_and_reads_no_facts(data: str, tmp_path: Path) -> None:
    kept = KeptPlans.of(str(tmp_path / "cache"), "parquet", data)
    first = plan(data, TwoRanks(), kept)
    ranks = TwoRanks()
    again = plan(data, ranks, kept)
    assert again.plan.fingerprint == first.plan.fingerprint
    assert ranks.shares == []  # no facts read, nothing counted
