"""An epoch's row order as runs of positions, and how it is cut into streams (pure).

A fresh epoch reads one run, ``[0, N)``: positions of the global row sequence (chunks
concatenated in the epoch's order). After an elastic resume the epoch goes on over what is left:
runs of positions, some of them a scattered selection (the unread rest of a shuffle block).
Streams are cut from the concatenated runs exactly as from a fresh epoch: equal spans per rank,
batch-aligned spans per worker.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import NoReturn

import numpy as np

from ..errors import InvalidArgumentError
from .assign import Piece, Remainder, rank_span, span_pieces, worker_span
from .shuffle import BlockOrder
from .topology import Topology

__all__ = [
    "Deferred",
    "DocumentRest",
    "Item",
    "Run",
    "cut",
    "refuse_second_rest",
    "round_robin_runs",
    "run_pieces",
    "sequence_length",
    "stream_runs",
]


def refuse_second_rest() -> NoReturn:
    """Refuse a second elastic resume inside one epoch of a packed dataset.

    Raises:
        InvalidArgumentError: always.
    """
    raise InvalidArgumentError(
        "a packed dataset resumes elastically once inside an epoch: resume the rest of this "
        "epoch on the topology it was saved on, or from the next epoch"
    )


@dataclass(frozen=True, slots=True)
class DocumentRest:
    """The rows of a packed stream's block left unread by an earlier leg: those after its first
    ``read`` rows in the block's document order (``order.documents(block, ...)``), in position
    order, ``[first, last)`` of them. Which rows they are depends on the documents' lengths:
    the reader works them out once it has read the block (docs/adr/0022).

    Attributes:
        order: the order the earlier leg's stream delivered its rows in.
        block: the block's index in that stream.
        read: rows of the block the earlier leg delivered.
        first, last: the rows ``[first, last)`` of the rest this run holds.
        ranges: the block's positions, ``[start, stop)`` ranges in order (two where the block
            wraps past the end of the sequence, under ``remainder="pad"``).
    """

    order: BlockOrder
    block: int
    read: int
    first: int
    last: int
    ranges: tuple[tuple[int, int], ...]

    def permutation(self, n: int) -> np.ndarray:
        """The order the earlier leg delivered the block's ``n`` documents in."""
        return self.order.documents(self.block, n)


@dataclass(frozen=True, slots=True, eq=False)
class Run:
    """Positions ``[start, stop)`` of the epoch's row sequence, in order.

    Attributes:
        start: first position.
        stop: one past the last position.
        select: when set, only these positions (sorted, inside ``[start, stop)``), in order.
        rest: a packed block's rows an earlier leg left (`DocumentRest`): ``[start, stop)``
            is the whole block.
    """

    start: int
    stop: int
    select: np.ndarray | None = None
    rest: DocumentRest | None = None

    @property
    def num_rows(self) -> int:
        """Rows in the run."""
        if self.rest is not None:
            return self.rest.last - self.rest.first
        return self.stop - self.start if self.select is None else len(self.select)

    def sub(self, first: int, last: int) -> Run:
        """Rows ``[first, last)`` of the run (counted inside it)."""
        if self.rest is not None:
            at = self.rest.first
            rest = dataclasses.replace(self.rest, first=at + first, last=at + last)
            return Run(self.start, self.stop, rest=rest)
        if self.select is None:
            return Run(self.start + first, self.start + last)
        chosen = self.select[first:last]
        if not len(chosen):
            return Run(self.start, self.start, chosen)
        return Run(int(chosen[0]), int(chosen[-1]) + 1, chosen)

    def positions(self, offsets: np.ndarray) -> np.ndarray:
        """The positions of rows ``offsets`` (counted inside the run).

        Raises:
            InvalidArgumentError: a packed block's rest, whose positions only its data tells
                (a second elastic resume inside one epoch of a packed dataset).
        """
        if self.rest is not None:
            refuse_second_rest()
        if self.select is None:
            return np.asarray(self.start + offsets)
        return np.asarray(self.select[offsets])

    def part(self, first: int, last: int) -> Run:
        """The earlier name of `sub`."""
        return self.sub(first, last)


@dataclass(frozen=True, slots=True, eq=False)
class Deferred:
    """Runs computed only when a stream needs them (their count of rows is known up front).

    The unread rest of a shuffle block needs its permutation to be known; an elastic resume
    computes only those of the blocks its own stream touches.
    """

    num_rows: int
    make: Callable[[], list[Run]]


Item = Run | Deferred


def sequence_length(items: Sequence[Item]) -> int:
    """Rows in the concatenation of ``items``."""
    return sum(item.num_rows for item in items)


def _runs(item: Item) -> list[Run]:
    return item.make() if isinstance(item, Deferred) else [item]


def cut(items: Sequence[Item], start: int, stop: int) -> list[Run]:
    """Rows ``[start, stop)`` of the concatenation of ``items``.

    Positions past the end wrap to the beginning (padding by wrapping). Deferred items are
    computed only when the range touches them.
    """
    total = sequence_length(items)
    if stop <= start or total == 0:
        return []
    ends = np.cumsum([item.num_rows for item in items])
    out: list[Run] = []
    pos = start
    while pos < stop:
        at = pos % total
        i = int(np.searchsorted(ends, at, side="right"))
        first = at - (int(ends[i]) - items[i].num_rows)
        take = min(items[i].num_rows - first, stop - pos)
        inner = 0
        for run in _runs(items[i]):
            lo, hi = max(first, inner), min(first + take, inner + run.num_rows)
            if lo < hi:
                out.append(run.sub(lo - inner, hi - inner))
            inner += run.num_rows
        pos += take
    return out


def stream_runs(
    items: Sequence[Item],
    topology: Topology,
    *,
    batch_size: int,
    drop_last: bool,
    remainder: Remainder,
) -> list[Run]:
    """The runs ``topology``'s stream reads: its rank's equal span, then its worker's part."""
    span = rank_span(
        sequence_length(items),
        rank=topology.rank,
        world_size=topology.world_size,
        batch_size=batch_size,
        drop_last=drop_last,
        remainder=remainder,
    )
    start, stop = worker_span(
        span, worker=topology.worker, num_workers=topology.num_workers, batch_size=batch_size
    )
    return cut(items, start, stop)


def round_robin_runs(
    rows_in_order: Sequence[int] | np.ndarray, topology: Topology, *, ends: np.ndarray | None = None
) -> list[Run]:
    """The earlier library's split: whole chunks dealt to the streams in turn (unequal)."""
    rows = np.asarray(rows_in_order, dtype=np.int64)
    if ends is None:
        ends = np.cumsum(rows)
    mine = np.arange(topology.stream, len(rows), topology.num_streams)
    mine = mine[rows[mine] > 0]
    return [
        Run(a, b)
        for a, b in zip((ends[mine] - rows[mine]).tolist(), ends[mine].tolist(), strict=True)
    ]


def run_pieces(
    run: Run,
    rows_in_order: Sequence[int] | np.ndarray,
    order: Sequence[int] | np.ndarray,
    *,
    ends: np.ndarray | None = None,
) -> tuple[list[Piece], np.ndarray | DocumentRest | None]:
    """The pieces that hold ``run``, and which of their rows it takes (``None``: all; a
    `DocumentRest`: the reader works them out from the rows)."""
    if run.rest is not None:
        ranges = run.rest.ranges
        block = [p for a, b in ranges for p in span_pieces(rows_in_order, order, a, b, ends=ends)]
        return block, run.rest
    pieces = span_pieces(rows_in_order, order, run.start, run.stop, ends=ends)
    if run.select is None:
        return pieces, None
    return pieces, run.select - run.start
