"""A dataset's streams balanced by compute (`balanced`): what a packed or token-budget batch
costs, from the plan and the length index planning kept (docs/adr/0032-balance-by-compute.md).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..batching import Balance, Packing
from ..options import Options
from ..planning import Plan
from ..planning.balance import batch_costs
from ..planning.balanced import Balanced
from ..planning.budget import Lengths, batch_shapes
from ..planning.pack_lengths import DocumentIndex, batch_fragments, document_tokens
from ..planning.streams import Stream, Streams
from ..sources.planned import PlannedSource
from ..stream.best_fit_lengths import best_fit_fragments

__all__ = ["PackCosts", "ShapeCosts", "balanced", "with_balance"]


def _balance(options: Options) -> Balance | None:
    packing, budget = options.packing, options.batching
    if packing is not None:
        return packing.balance
    return None if budget is None else budget.balance


def with_balance(plan: Plan, options: Options) -> Plan:
    """``plan`` with its balance in its details (a state saved under another is refused)."""
    balance = _balance(options)
    if balance is None:
        return plan
    details = (*plan.details, *Plan.details_of(balance=json.dumps(balance.identity())))
    return dataclasses.replace(plan, details=tuple(sorted(details)))


def balanced(
    streams: Streams,
    sources: Sequence[PlannedSource],
    options: Options,
    lengths: Lengths | None,
) -> Streams:
    """``streams`` balanced as the options' `Balance` asks (themselves without one)."""
    balance = _balance(options)
    if balance is None:
        return streams
    costs: PackCosts | ShapeCosts
    if options.packing is not None:
        costs = PackCosts.of(sources, options.packing, options.batch_size, balance)
    else:
        assert lengths is not None, "a token budget keeps its length index"
        costs = ShapeCosts(lengths, balance)
    return Balanced(streams, balance.window, costs)


@dataclass(frozen=True, eq=False)
class PackCosts:
    """What each packed batch of a stream costs: its fragments' lengths
    (`planning.pack_lengths`) under the balance's cost.

    Attributes:
        lengths: each source's rows' list lengths, in plan order (int32; a null list 0).
        chunk_rows: each source's rows a chunk, in plan order.
        chunk_tokens: each source's tokens a chunk (the packed plan's rows).
        packing: the packing.
        batch_size: sequences a batch.
        balance: the cost and its linear weight.
    """

    lengths: tuple[np.ndarray, ...]
    chunk_rows: tuple[np.ndarray, ...]
    chunk_tokens: tuple[np.ndarray, ...]
    packing: Packing
    batch_size: int
    balance: Balance
    _indexes: list[DocumentIndex] = field(default_factory=list, repr=False, compare=False)

    @classmethod
    def of(
        cls, sources: Sequence[PlannedSource], packing: Packing, batch_size: int, balance: Balance
    ) -> PackCosts:
        for s in sources:
            assert s.row_lengths is not None, "a balanced packing's planning keeps row lengths"
            assert s.chunk_tokens is not None, "a packed dataset's planning counts tokens"
        return cls(
            tuple(np.asarray(s.row_lengths) for s in sources),
            tuple(np.asarray(s.plan.chunk_rows, np.int64) for s in sources),
            tuple(np.asarray(s.chunk_tokens, np.int64) for s in sources),
            packing,
            batch_size,
            balance,
        )

    def indexes(self) -> list[DocumentIndex]:
        """Each source's length index (made once a process: 16 bytes a document)."""
        if not self._indexes:
            eos = self.packing.eos_token is not None
            for lengths, rows, tokens in zip(
                self.lengths, self.chunk_rows, self.chunk_tokens, strict=True
            ):
                documents = document_tokens(lengths, eos=eos)
                if eos:
                    documents = _nulls_without_eos(documents, rows, tokens)
                self._indexes.append(DocumentIndex.of(documents, rows))
        return self._indexes

    def __call__(self, stream: Stream) -> np.ndarray:
        packing = self.packing
        if packing.method == "concat":
            lengths, offsets = batch_fragments(stream, self.indexes(), seq_len=packing.seq_len)
        else:
            lengths, offsets = best_fit_fragments(
                stream, self.indexes(), seq_len=packing.seq_len, batch_size=self.batch_size
            )
        return batch_costs(lengths, offsets, self.balance.cost, linear=self.balance.linear)

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_indexes"] = []  # (each process makes its own from the lengths)
        return state


def _nulls_without_eos(documents: np.ndarray, rows: np.ndarray, tokens: np.ndarray) -> np.ndarray:
    """``documents`` (each counted with an ``eos_token``) less the one of each null list that
    the length index did not mark (-1): a census kept by an earlier version counted a null
    list as empty. A chunk's count over its planned tokens is its null lists, which are among
    its empty ones; its first empty lists are taken for them, so only the predicted costs can
    differ (by a token), never what is read."""
    ends = np.cumsum(rows)
    total = np.r_[0, np.cumsum(documents)]
    excess = total[ends] - total[ends - rows] - tokens
    if not excess.any():
        return documents
    chunk = np.repeat(np.arange(len(rows)), rows)
    empty = documents == 1  # (with an eos_token: an empty list's, or a null one's)
    seen = np.r_[0, np.cumsum(empty)]
    within = seen[:-1] - seen[ends - rows][chunk]  # (empty lists before it in its chunk)
    out = documents.copy()
    out[empty & (within < excess[chunk])] = 0
    return out


@dataclass(frozen=True, eq=False)
class ShapeCosts:
    """What each token-budget batch of a stream costs: its padded shape
    (`planning.budget.batch_shapes`) under the balance's cost."""

    lengths: Lengths
    balance: Balance

    def __call__(self, stream: Stream) -> np.ndarray:
        lengths, offsets = batch_shapes(stream, self.lengths)
        return batch_costs(lengths, offsets, self.balance.cost, linear=self.balance.linear)
