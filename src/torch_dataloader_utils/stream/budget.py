"""Token-budget batches of a stream: each group of rows (a batch of the planner's) cut into the
batches its pass was given (`planning.budget`): rows sorted by length, cut greedily under the
budget, the largest batches split until the count is the one every rank has."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ..convert.arrow_values import list_lengths, take
from ..errors import DataError
from ..planning.budget import BudgetPass, equalised, group_batches
from .blocks import Segment
from .fragments import Fragments

__all__ = ["budget_batches"]

logger = logging.getLogger("torch_dataloader_utils.dataset")


def budget_batches(
    groups: Iterable[Segment], budget: BudgetPass, *, where: Callable[[], str]
) -> Iterator[Segment]:
    """The budget batches of ``groups`` (a stream's groups from where its pass starts).

    A row longer than the budget is cut to it under ``overflow="truncate"`` (the tokens cut
    are logged; planning refused such rows otherwise). ``where()`` names the files read last.

    Raises:
        DataError: a group's rows need more batches than planning counted (the files changed
            since planning).
    """
    cut = 0
    counts = iter(budget.counts)
    skip = budget.skip
    block: Any = None  # the block (or batch) whose rows' lengths are `every`
    every = np.zeros(0, np.int64)
    for batch, rows in groups:
        count = next(counts, None)
        if count is None:
            raise DataError(f"{where()}: the stream holds more rows than planning counted")
        assert not isinstance(batch, Fragments), "token budgets batch rows, not tokens"
        if batch is not block:  # (a block's groups share it: its lengths once, from offsets)
            block, every = batch, list_lengths(batch.column(budget.column))
        lengths = every if rows is None else every[np.asarray(rows)]
        order, bounds = group_batches(np.minimum(lengths, budget.max_tokens), budget.max_tokens)
        bounds = equalised(bounds, count)
        if len(bounds) - 1 != count:
            raise DataError(
                f"{where()}: a group of {len(lengths)} rows makes {len(bounds) - 1} token-budget "
                f"batches where planning counted {count}; were the files changed while reading?"
            )
        for a, b in zip(bounds[skip:-1], bounds[skip + 1 :], strict=True):
            picked = order[a:b]
            chosen = picked if rows is None else np.asarray(rows)[picked]
            if budget.truncate and int(lengths[picked].max(initial=0)) > budget.max_tokens:
                taken = take(batch, chosen)
                cut += int(np.maximum(lengths[picked] - budget.max_tokens, 0).sum())
                yield _truncated(taken, budget.column, budget.max_tokens), None
            else:
                yield batch, chosen
        skip = 0
    if cut:
        logger.warning("%s: %d tokens cut from rows longer than max_tokens", where(), cut)


def _truncated(batch: pa.RecordBatch, column: str, max_tokens: int) -> pa.RecordBatch:
    """``batch`` with each list of ``column`` cut to its first ``max_tokens`` values."""
    index = batch.schema.get_field_index(column)
    cut = pc.list_slice(batch.column(index), 0, max_tokens)
    return batch.set_column(
        index, batch.schema.field(index), cut.cast(batch.schema.field(index).type)
    )
