"""Token-budget batches: whole rows, each batch's padded size (rows x longest row) at most a
budget, the same number of batches on every rank, known before the epoch (pure).

The design (docs/adr/0022-packed-sequences.md#token-budgets): the streams are cut as usual,
in *groups* of a fixed number of rows (the layout's batch). A group's rows are sorted by
length and cut greedily under the budget (`group_batches`), so a group makes a number of
batches that depends on its rows' lengths. Planning keeps every row's length (`Lengths`, the
length index), so every process computes every stream's counts for an epoch without reading
data or talking to the others; group ``m`` of every rank's stream of worker ``w`` then makes
as many batches as the most any of them needs (`BudgetPass`), the others splitting their
largest batches (`equalised`). A state counts batches; a resume seeks to a group.
"""

from __future__ import annotations

import functools
import itertools
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import Any

import numpy as np

from .layout import Layout
from .resume import Leg, block_rest, consumed, stream_spans
from .sequence import Deferred, Item, Run, cut, sequence_length, stream_runs
from .shuffle import BlockOrder
from .strategy import EpochRows
from .topology import Topology

__all__ = [
    "BudgetPass",
    "batch_shapes",
    "BudgetRows",
    "Lengths",
    "equalised",
    "group_batches",
    "group_counts",
    "group_rows",
    "group_table",
    "mean_batch_rows",
]


@dataclass(frozen=True, eq=False)
class Lengths:
    """Each row's length in the budget's column (the length index), in plan order.

    Attributes:
        max_tokens: the budget of a batch.
        values: each row's length (after the row filter), chunk after chunk (int32); rows
            longer than the budget (``overflow="truncate"``) count as the budget.
        chunk_rows: rows of each chunk, in plan order.
    """

    max_tokens: int
    values: np.ndarray
    chunk_rows: np.ndarray

    def in_order(self, order: np.ndarray) -> np.ndarray:
        """The lengths of the rows of the chunks ``order``, one chunk after the other."""
        starts = np.cumsum(self.chunk_rows) - self.chunk_rows
        counts = self.chunk_rows[order]
        base = np.repeat(starts[order] - (np.cumsum(counts) - counts), counts)
        out: np.ndarray = self.values[base + np.arange(int(counts.sum()))]
        return out


@dataclass(frozen=True)
class BudgetPass:
    """What a stream's pass needs to cut its groups into budget batches.

    Attributes:
        counts: batches of each group the pass reads, from its first group.
        skip: batches of the first group delivered before the pass began (a resume).
        groups_done: groups delivered whole before the pass began.
        max_tokens: the budget of a batch.
        column: the list column whose lengths count.
        truncate: rows longer than the budget are cut to it (``overflow="truncate"``).
    """

    counts: tuple[int, ...]
    skip: int
    groups_done: int
    max_tokens: int
    column: str
    truncate: bool = False


# Budget batches a group makes, about: more makes fewer short batches (each group's last is
# short) and splits, fewer makes a first batch sooner and less to sort.
_BATCHES_PER_GROUP = 16


def mean_batch_rows(group: int) -> int:
    """Rows of a budget batch, about, in groups of ``group`` rows (`group_rows`): what a
    worker's messages are sized by (`transport.worker_messages`)."""
    return max(1, group // _BATCHES_PER_GROUP)


def group_rows(lengths: Lengths) -> int:
    """Rows of a group (the planner's batch) for ``lengths``: about `_BATCHES_PER_GROUP`
    batches of rows of the mean length."""
    mean = float(lengths.values.mean()) if len(lengths.values) else 1.0
    return max(1, int(_BATCHES_PER_GROUP * lengths.max_tokens / max(mean, 1.0)))


def group_batches(lengths: np.ndarray, max_tokens: int) -> tuple[np.ndarray, list[int]]:
    """A group's rows sorted by length (stable; as indices into ``lengths``) and where its
    batches start in that order: each batch takes the next rows while (rows x the longest)
    stays within ``max_tokens`` (a row longer than that is a batch alone)."""
    order = np.argsort(lengths, kind="stable")
    # (Python ints: the search below reads one or two a step, where numpy's scalars cost more
    # than the step: docs/benchmarks.md#token-budget-batches-cut-by-bisection.)
    ordered: list[int] = np.maximum(lengths[order], 1).tolist()
    bounds = [0]
    at, n = 0, len(ordered)
    while at < n:
        # rows x the longest (the last, sorted) only grows with the rows taken: the most rows
        # within the budget by bisection, among those that could fit at the shortest's length
        # (at least one: a row over the budget is a batch alone).
        fits, most = 1, min(n - at, max_tokens // ordered[at])
        while fits < most:
            mid = (fits + most + 1) // 2
            if mid * ordered[at + mid - 1] <= max_tokens:
                fits = mid
            else:
                most = mid - 1
        at += fits
        bounds.append(at)
    return order, bounds


def equalised(bounds: list[int], count: int) -> list[int]:
    """``bounds`` (batch starts, then the end) split into ``count`` batches: the batch with the
    most rows halved, again, until there are ``count`` (or every batch is one row)."""
    bounds = list(bounds)
    while len(bounds) - 1 < count:
        sizes = np.diff(bounds)
        widest = int(np.argmax(sizes)) if len(sizes) else 0
        if not len(sizes) or sizes[widest] < 2:
            break
        bounds.insert(widest + 1, bounds[widest] + int(sizes[widest]) // 2)
    return bounds


def group_counts(lengths: np.ndarray, group: int, max_tokens: int) -> np.ndarray:
    """Budget batches of each group of ``group`` rows of a stream's rows (``lengths``, in the
    order the stream delivers them)."""
    return np.asarray(
        [
            len(group_batches(lengths[a : a + group], max_tokens)[1]) - 1
            for a in range(0, len(lengths), group)
        ],
        dtype=np.int64,
    )


def delivered_lengths(
    ordered: np.ndarray, runs: Sequence[Run], layout: Layout, *, epoch: int, stream: int, leg: int
) -> np.ndarray:
    """The lengths of a stream's rows (``runs`` of the epoch's sequence, whose rows have
    lengths ``ordered``) in the order it delivers them: shuffled in blocks as
    `stream.blocks.shuffled_blocks` shuffles them."""
    positions = [
        np.arange(r.start, r.stop) if r.select is None else np.asarray(r.select) for r in runs
    ]
    lengths: np.ndarray = ordered[np.concatenate(positions)] if positions else ordered[:0]
    if not layout.shuffle:
        return lengths
    order = BlockOrder(layout, len(lengths), epoch, stream, leg=leg)
    out: np.ndarray = lengths[order.delivered(np.arange(len(lengths)))]
    return out


def group_table(
    items: Sequence[Item],
    ordered: np.ndarray,
    layout: Layout,
    *,
    world_size: int,
    num_workers: int,
    epoch: int,
    leg: int,
    max_tokens: int,
    workers: Sequence[int] | None = None,
) -> list[np.ndarray]:
    """Budget batches of each group of each worker's stream of a leg reading ``items``: the
    most that group of any rank's stream of that worker needs (every rank then has them).
    ``workers``: only these workers' (the others' entries empty)."""
    out = []
    for worker in range(num_workers):
        if workers is not None and worker not in workers:
            out.append(np.zeros(0, np.int64))
            continue
        counts = []
        for rank in range(world_size):
            topology = Topology(rank, world_size, worker, num_workers)
            runs = stream_runs(
                items,
                topology,
                batch_size=layout.batch_size,
                drop_last=layout.drop_last,
                remainder=layout.remainder,
            )
            lengths = delivered_lengths(
                ordered, runs, layout, epoch=epoch, stream=topology.stream, leg=leg
            )
            counts.append(group_counts(lengths, layout.batch_size, max_tokens))
        most = np.zeros(max((len(c) for c in counts), default=0), np.int64)
        for c in counts:
            most[: len(c)] = np.maximum(most[: len(c)], c)
        out.append(most)
    return out


def batch_shapes(stream: Any, lengths: Lengths) -> tuple[np.ndarray, np.ndarray]:
    """Every token-budget batch of ``stream``'s pass (`Budgeted.resolve` from its start) as its
    padded shape: each row as long as the batch's longest, ``(lengths, offsets)`` as
    `balance.batch_costs` takes them (batch ``b``'s rows are ``lengths[offsets[b]:offsets[b +
    1]]``), from the length index alone."""
    budget = stream.budget
    assert budget is not None and budget.groups_done == 0, "a budget stream's whole pass"
    (rows,) = stream.sources
    ordered = lengths.in_order(rows.order.order)
    pass_ = stream.pass_
    delivered = delivered_lengths(
        ordered,
        rows.runs,
        rows.order.layout,
        epoch=pass_.epoch,
        stream=stream.topology.stream,
        leg=len(pass_.legs),
    )
    delivered = np.minimum(delivered, lengths.max_tokens)
    group = stream.layout.batch_size
    out: list[np.ndarray] = []
    sizes: list[int] = []
    for g, count in enumerate(budget.counts):
        mine = delivered[g * group : (g + 1) * group]
        order, bounds = group_batches(mine, lengths.max_tokens)
        bounds = equalised(bounds, int(count))
        for a, b in itertools.pairwise(bounds):
            longest = int(mine[order[a:b]].max(initial=0))
            out.append(np.full(b - a, longest, np.int64))
            sizes.append(b - a)
    offsets = np.zeros(len(sizes) + 1, np.int64)
    np.cumsum(sizes, out=offsets[1:])
    flat = np.concatenate(out) if out else np.zeros(0, np.int64)
    return flat, offsets


def split_done(counts: np.ndarray, done: int) -> tuple[int, int]:
    """A stream that delivered ``done`` budget batches: its groups delivered whole, and the
    batches of the next one delivered (``counts``: each group's batches)."""
    ends = np.cumsum(counts)
    groups = int(np.searchsorted(ends, done, side="right"))
    return groups, done - (int(ends[groups - 1]) if groups else 0)


def remaining_budget(
    items: Sequence[Item], leg: Leg, *, epoch: int, depth: int, ordered: np.ndarray, max_tokens: int
) -> list[Item]:
    """`resume.remaining` for token-budget batches: a stream that stopped inside a group
    delivered the rows of that group's first batches, which the group's lengths tell."""
    layout = leg.layout
    group = layout.batch_size
    total = sequence_length(items)
    table = group_table(
        items,
        ordered,
        layout,
        world_size=leg.world_size,
        num_workers=leg.num_workers,
        epoch=epoch,
        leg=depth,
        max_tokens=max_tokens,
    )
    left: list[Item] = []
    for rank in range(leg.world_size):
        spans = stream_spans(
            total, rank=rank, world_size=leg.world_size, num_workers=leg.num_workers, layout=layout
        )
        done = consumed([int(t.sum()) for t in table], leg.batches)
        for worker, span in enumerate(spans):
            length = span[1] - span[0]
            groups, within = split_done(table[worker], done[worker])
            read = min(groups * group, length)
            if read >= length:
                continue
            stream = rank * leg.num_workers + worker
            also = None
            if within:  # the rows of the group's first batches, in the stream's order
                runs = cut(items, *span)
                lengths = delivered_lengths(
                    ordered, runs, layout, epoch=epoch, stream=stream, leg=depth
                )[read : read + group]
                order, bounds = group_batches(lengths, max_tokens)
                bounds = equalised(bounds, int(table[worker][groups]))
                also = np.sort(order[: bounds[within]])
            blocks = BlockOrder(layout, length, epoch, stream, leg=depth)
            partial, untouched = block_rest(items, span, read, blocks, also=also)
            left.extend(partial)
            if untouched < length:
                a, b = span[0] + untouched, span[0] + length
                left.append(Deferred(b - a, functools.partial(cut, items, a, b)))
    return left


@dataclass(frozen=True, eq=False)
class BudgetRows(EpochRows):
    """An epoch's rows read in token-budget batches: what earlier legs left of it is worked
    out from the rows' lengths (`remaining_budget`)."""

    lengths: Lengths | None = None

    @cached_property
    def sequence(self) -> list[Item]:
        assert self.lengths is not None, "budget rows have lengths"
        total = int(self.ends[-1]) if len(self.ends) else 0
        items: list[Item] = [Run(0, total)] if total else []
        ordered = self.lengths.in_order(self.order)
        for depth, leg in enumerate(self.legs):
            items = remaining_budget(
                items,
                leg,
                epoch=self.epoch,
                depth=depth,
                ordered=ordered,
                max_tokens=self.lengths.max_tokens,
            )
        return items
