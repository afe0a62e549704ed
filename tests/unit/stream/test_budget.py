"""Token-budget batches of a stream (`stream.budget.budget_batches`): each group's rows sorted by
length and cut under the budget, into exactly the batches planning counted; a resumed pass skips
the batches delivered; a row over the budget is cut under ``overflow="truncate"``."""

from __future__ import annotations

import logging
from collections import Counter
from typing import Any

import numpy as np
import pyarrow as pa
import pytest

from torch_dataloader_utils.errors import DataError
from torch_dataloader_utils.planning.budget import BudgetPass, group_counts
from torch_dataloader_utils.stream.budget import budget_batches

LENGTHS = [3, 1, 7, 2, 2, 5, 1, 4, 8, 2, 6, 3]


def group(lengths: list[int], first: int = 0) -> pa.RecordBatch:
    """Rows ``first``, ... of ``lengths`` tokens each (token ``100 * row + position``)."""
    tokens = [[100 * (first + r) + p for p in range(n)] for r, n in enumerate(lengths)]
    return pa.record_batch(
        {"id": list(range(first, first + len(lengths))), "tokens": pa.array(tokens)}
    )


def counted(lengths: list[int], max_tokens: int = 8) -> int:
    """Budget batches planning counts for one group of rows of ``lengths`` tokens."""
    return int(group_counts(np.array(lengths), len(lengths), max_tokens)[0])


def budget(counts: list[int], skip: int = 0, truncate: bool = False) -> BudgetPass:
    return BudgetPass(tuple(counts), skip, 0, 8, "tokens", truncate=truncate)


def batches(groups: list[Any], budget: BudgetPass) -> list[pa.RecordBatch]:
    out = budget_batches(groups, budget, where=lambda: "a.parquet")
    return [batch if rows is None else batch.take(pa.array(rows)) for batch, rows in out]


def ids(batch: pa.RecordBatch) -> list[int]:
    return batch.column("id").to_pylist()


def test_every_row_once_in_the_batches_planning_counted_each_within_the_budget() -> None:
    first, second = group(LENGTHS[:7]), group(LENGTHS[7:], first=7)
    counts = [counted(LENGTHS[:7]), counted(LENGTHS[7:])]
    out = batches([(first, None), (second, None)], budget(counts))
    assert len(out) == sum(counts)
    for batch in out:
        lengths = [len(t) for t in batch.column("tokens").to_pylist()]
        assert len(lengths) * max(lengths) <= 8
    assert Counter(i for b in out for i in ids(b)) == Counter(range(len(LENGTHS)))
    # Within a group, by length: shorter rows first.
    in_first = [len(t) for b in out[: counts[0]] for t in b.column("tokens").to_pylist()]
    assert in_first == sorted(LENGTHS[:7])


def test_a_group_read_as_rows_of_a_block_takes_those_rows_only() -> None:
    rows = [11, 0, 4, 9]
    out = batches([(group(LENGTHS), rows)], budget([counted([LENGTHS[r] for r in rows])]))
    assert sorted(i for b in out for i in ids(b)) == sorted(rows)


def test_more_batches_counted_split_the_largest_and_a_resume_skips_the_delivered() -> None:
    whole = group(LENGTHS)
    split = batches([(whole, None)], budget([counted(LENGTHS) + 2]))
    assert len(split) == counted(LENGTHS) + 2
    resumed = batches([(whole, None)], budget([counted(LENGTHS) + 2], skip=3))
    assert [ids(b) for b in resumed] == [ids(b) for b in split[3:]]


def test_rows_that_do_not_match_the_plan_are_an_error() -> None:
    whole = group(LENGTHS)
    with pytest.raises(DataError, match=r"a group of 12 rows makes \d+ .* planning counted 1;"):
        batches([(whole, None)], budget([1]))
    with pytest.raises(DataError, match=r"a\.parquet: the stream holds more rows than planning"):
        batches([(whole, None), (whole, None)], budget([counted(LENGTHS)]))


def test_rows_over_the_budget_are_cut_when_asked(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="torch_dataloader_utils"):
        out = batches([(group([3, 12, 2]), None)], budget([counted([3, 8, 2])], truncate=True))
    tokens = dict(
        zip(
            [i for b in out for i in ids(b)],
            [t for b in out for t in b.column("tokens").to_pylist()],
            strict=True,
        )
    )
    assert tokens[1] == [100 + p for p in range(8)] and len(tokens[0]) == 3
    assert "a.parquet: 4 tokens cut from rows longer than max_tokens" in caplog.text
