"""What packing and token budgets make of a dataset's planned sources: the plan of an order
of tokens (`in_tokens`), and the length index of token-budget batches (`length_index`);
docs/adr/0022-packed-sequences.md."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence

import numpy as np
import pyarrow as pa

from ..batching import Packing, TokenBudget
from ..errors import DataError, InvalidArgumentError
from ..planning import Plan
from ..planning.budget import Lengths
from ..sources.planned import PlannedSource

__all__ = ["in_tokens", "length_index"]


def in_tokens(source: PlannedSource, packing: Packing) -> PlannedSource:
    """``source`` with the plan of a packed dataset's order: its chunks' tokens as rows
    (docs/adr/0022), counted at planning; a token is a row of ``input_ids`` (a worker holds
    them as `stream.fragments.Fragments`)."""
    kind = source.plan.schema.field(packing.column).type  # (checked by planning)
    assert source.chunk_tokens is not None, "a packed dataset's planning counts tokens"
    identity = {
        "column": packing.column,
        "seq_len": packing.seq_len,
        "method": packing.method,
        "eos_token": packing.eos_token,
    }
    if packing.method == "best_fit":  # (concat takes every slot whatever the fill)
        identity["fill"] = packing.fill
    plan = Plan(
        chunks=source.plan.chunks,
        schema=pa.schema([pa.field("input_ids", kind.value_type, nullable=False)]),
        row_bytes=kind.value_type.bit_width / 8,  # (a block holds the token values)
        details=(*source.plan.details, *Plan.details_of(packing=json.dumps(identity))),
        filtered_rows=source.chunk_tokens,
        files=source.plan.files,
    )
    return dataclasses.replace(source, plan=plan, row_bytes=plan.row_bytes)


def length_index(sources: Sequence[PlannedSource], plan: Plan, budget: TokenBudget) -> Lengths:
    """A token budget's length index (`planning.budget.Lengths`) of the only source.

    Raises:
        InvalidArgumentError: a mixture (not built yet).
        DataError: a row longer than the budget under ``overflow="error"``, named by its file.
    """
    if len(sources) != 1:
        raise InvalidArgumentError("token-budget batches of a mixture are not built yet")
    (only,) = sources
    assert only.row_lengths is not None, "a token budget's planning keeps every row's length"
    values = np.maximum(only.row_lengths, 0)  # (a null list, marked -1, holds no token)
    longest = int(values.max(initial=0))
    if longest > budget.max_tokens:
        if budget.overflow == "error":
            at = int(np.argmax(values > budget.max_tokens))
            chunk = int(np.searchsorted(np.cumsum(plan.chunk_rows), at, side="right"))
            raise DataError(
                f"{only.fs.url(plan.chunks[chunk].path)}: a row of {longest} values in "
                f"{budget.column!r} is "
                f"longer than TokenBudget(max_tokens={budget.max_tokens}); raise max_tokens, or "
                'pass overflow="truncate" to cut such rows to it'
            )
        values = np.minimum(values, budget.max_tokens)
    return Lengths(budget.max_tokens, values, np.asarray(plan.chunk_rows, dtype=np.int64))
