"""Which rows each worker's stream reads in a pass, and where it starts: the one resolver.

A dataset's `Streams` answers the two questions of a pass for every process alike: the batches
of each stream of a rank (the main process orders the workers' batches and counts a rank's by
them), and the `Stream` a worker reads. Three kinds, two ways of building an epoch and one
way of batching it:

- `OneSource`: one plan's chunks, cut into streams by the layout's `Strategy`;
- `Mixed`: a mixture's sources, each delivering its quota, interleaved position by position
  (`planning.mixture`), cut into streams as one source's epoch is;
- `Budgeted`: one source's streams read in token-budget batches (`planning.budget`).

A stream is the same value for all: the rows it reads of each source (`SourceRows`: runs of
that source's epoch, where the pass starts in them) and, for a mixture, the interleave that
says which source each position holds. `stream.pipeline` reads each source's rows the same way.
What callers ask of a kind (its weights schedule, its length index, the same streams under
another layout) the protocol answers: no caller tells the kinds apart.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from ..errors import InvalidArgumentError
from .assign import Piece
from .balance import BalancedPass
from .budget import BudgetPass, BudgetRows, Lengths, group_table, split_done
from .layout import Layout
from .mixture import MixEpoch, Mixture
from .phases import Labels
from .plan import Plan
from .resume import Pass, consumed
from .sequence import Run, sequence_length
from .shuffle import BlockOrder
from .strategy import EpochRows, strategy_of
from .topology import Topology

__all__ = ["Budgeted", "Mixed", "OneSource", "SourceRows", "Stream", "Streams"]


@dataclass(frozen=True, eq=False)
class SourceRows:
    """The rows a stream reads of one source.

    Attributes:
        index: the source's number in the mixture, which keys these rows' block permutations
            (``None``: a dataset of one source).
        order: the source's epoch in order (its chunk order; its layout cuts the blocks).
        runs: the runs of the source's epoch sequence the stream reads, in order.
        length: rows in ``runs``.
        start: rows of ``runs`` delivered before the pass began (a resume starts there).
    """

    index: int | None
    order: EpochRows
    runs: list[Run]
    length: int
    start: int

    def pieces(self) -> list[Piece]:
        """The pieces of chunks these rows are in a fresh pass, in order."""
        return self.order.pieces(self.runs)

    @property
    def source(self) -> int | None:
        """The earlier name of `index`."""
        return self.index

    @property
    def epoch_rows(self) -> EpochRows:
        """The earlier name of `order`."""
        return self.order


@dataclass(frozen=True, eq=False)
class Stream:
    """One worker's stream of one pass.

    Attributes:
        topology: the rank and worker that read it.
        pass_: the pass.
        layout: the current leg's layout (batch size, shuffle).
        sources: the rows it reads of each source (one for a dataset of one source).
        length: rows in the stream.
        batches: batches the stream yields in the pass, from its start.
        done: batches it delivered before this pass began (a resume starts there).
        interleave: a mixture's: which source each position of the leg's sequence holds;
            the stream is its positions ``[first, first + length)``.
        first: the stream's first position in the interleave's sequence.
        budget: token-budget batches' (`Budgeted`): each group's batch count; ``batches`` and
            ``done`` then count those batches.
        balanced: balanced batches' (`planning.balanced.Balanced`): the batches it delivers
            are other streams' (every rank's of its worker), picked by cost.
    """

    topology: Topology
    pass_: Pass
    layout: Layout
    sources: tuple[SourceRows, ...]
    length: int
    batches: int
    done: int
    interleave: Labels | None = None
    first: int = 0
    budget: BudgetPass | None = None
    balanced: BalancedPass | None = None

    @property
    def iteration(self) -> Pass:
        """The earlier name of `pass_`."""
        return self.pass_

    @property
    def start(self) -> int:
        """The stream row the pass starts at."""
        done = self.done if self.budget is None else self.budget.groups_done
        return min(done * self.layout.batch_size, self.length)

    def order_of(self, rows: SourceRows) -> BlockOrder:
        """The order the stream delivers ``rows`` (one of its `sources`) in."""
        pass_ = self.pass_
        return BlockOrder(
            rows.order.layout,
            rows.length,
            pass_.epoch,
            self.topology.stream,
            leg=len(pass_.legs),
            source=rows.index,
        )


class Streams(Protocol):
    """How a dataset's epochs are cut into streams (`OneSource`, `Mixed`, `Budgeted`)."""

    @property
    def layout(self) -> Layout:
        """The options that order and cut the streams."""

    @property
    def epoch_rows(self) -> int:
        """Rows an epoch reads across all ranks, before the remainder policy."""

    @property
    def scheduled(self) -> bool:
        """Whether a weights schedule changes the mix (counted in steps: `Pass.steps`)."""

    @property
    def lengths(self) -> Lengths | None:
        """A token budget's length index, each row's length in its column (None: no budget)."""

    @property
    def skips_carried(self) -> bool:
        """Whether batches skipped on one topology can be left out, as their rows, of a resume
        on another (`resume.remaining`): not packed sequences' nor token budgets'."""

    def with_layout(self, layout: Layout) -> Streams:
        """These streams cut and ordered with ``layout`` (an earlier leg's): themselves when
        it is theirs."""

    def budgeted(self, lengths: Lengths, column: str, truncate: bool) -> Streams:
        """These streams read in token-budget batches of ``column`` (`Budgeted`), whose rows
        have ``lengths`` (``truncate``: rows longer than the budget are cut to it).

        Raises:
            InvalidArgumentError: the streams are not one source's rows.
        """

    def rank_streams(self, pass_: Pass, rank: Topology) -> tuple[list[int], list[int]]:
        """Batches of each stream of ``rank`` (one per worker of its ``num_workers``) in
        ``pass_``, and how many each delivered before it began."""

    def resolve(self, pass_: Pass, topology: Topology, *, done: int | None = None) -> Stream:
        """The stream ``topology`` reads in ``pass_``.

        ``done``: batches the stream already delivered (a worker's own saved state); by
        default, its share of the batches its rank delivered (``pass_.batches``, in
        DataLoader order).
        """

    def rank_batches(self, rank: Topology, epoch: int) -> int:
        """Batches ``rank`` yields in a fresh pass over ``epoch`` (with ``rank.num_workers``
        workers where that matters).

        Raises:
            TypeError: the count depends on the number of workers.
        """


def _done(counts: list[int], pass_: Pass, worker: int, done: int | None) -> int:
    return consumed(counts, pass_.batches)[worker] if done is None else done


@dataclass(frozen=True, eq=False)
class OneSource:
    """The streams of one plan's chunks under ``layout``.

    ``chunks``: the plan, or its chunks' rows in plan order. (The plan rather than its rows:
    pickled to a spawned worker, a plan's arrays cross once in shared memory, while an array of
    rows would cross again as bytes, 8 a chunk.) ``lengths``: a token budget's length index,
    by which what earlier legs left of an epoch is worked out (`planning.budget.BudgetRows`).
    """

    chunks: Plan | Sequence[int] | np.ndarray
    layout: Layout
    lengths: Lengths | None = None

    @property
    def chunk_rows(self) -> Sequence[int] | np.ndarray:
        """Rows of each chunk, in plan order."""
        return self.chunks.chunk_rows if isinstance(self.chunks, Plan) else self.chunks

    @property
    def epoch_rows(self) -> int:
        return int(np.sum(np.asarray(self.chunk_rows, dtype=np.int64)))

    @property
    def scheduled(self) -> bool:
        return False

    @property
    def skips_carried(self) -> bool:
        return not self.layout.seq_tokens

    def with_layout(self, layout: Layout) -> OneSource:
        return self if layout == self.layout else dataclasses.replace(self, layout=layout)

    def budgeted(self, lengths: Lengths, column: str, truncate: bool) -> Budgeted:
        return Budgeted(dataclasses.replace(self, lengths=lengths), column, truncate)

    def rows(self, pass_: Pass) -> EpochRows:
        """The epoch's rows as ``pass_`` reads them."""
        if self.lengths is not None:
            rows = (self.chunk_rows, pass_.epoch, pass_.legs, self.layout)
            return BudgetRows(*rows, self.lengths)
        return EpochRows(self.chunk_rows, pass_.epoch, pass_.legs, self.layout)

    def rank_streams(self, pass_: Pass, rank: Topology) -> tuple[list[int], list[int]]:
        rows = strategy_of(self.layout.strategy).stream_rows(self.rows(pass_), rank)
        counts = [self.layout.batches(n) for n in rows]
        return counts, consumed(counts, pass_.batches)

    def resolve(self, pass_: Pass, topology: Topology, *, done: int | None = None) -> Stream:
        epoch = self.rows(pass_)
        strategy = strategy_of(self.layout.strategy)
        counts = [self.layout.batches(n) for n in strategy.stream_rows(epoch, topology)]
        done = _done(counts, pass_, topology.worker, done)
        runs = strategy.runs(epoch, topology)
        length = sequence_length(runs)
        start = min(done * self.layout.batch_size, length)
        return Stream(
            topology=topology,
            pass_=pass_,
            layout=self.layout,
            sources=(SourceRows(None, epoch, runs, length, start),),
            length=length,
            batches=counts[topology.worker],
            done=done,
        )

    def rank_batches(self, rank: Topology, epoch: int = 0) -> int:
        strategy = strategy_of(self.layout.strategy)
        return strategy.rank_batches(self.epoch_rows, rank, self.layout)


@dataclass(frozen=True, eq=False)
class Mixed:
    """The streams of a mixture's epochs under ``layout`` (``"equal"`` streams only)."""

    mixture: Mixture
    layout: Layout

    @property
    def epoch_rows(self) -> int:
        return sum(self.mixture.quotas)

    @property
    def scheduled(self) -> bool:
        """Whether the weights follow a schedule (`planning.schedule`)."""
        return self.mixture.schedule is not None

    @property
    def lengths(self) -> None:
        return None

    @property
    def skips_carried(self) -> bool:
        return not self.layout.seq_tokens

    def with_layout(self, layout: Layout) -> Mixed:
        return self if layout == self.layout else dataclasses.replace(self, layout=layout)

    def budgeted(self, lengths: Lengths, column: str, truncate: bool) -> Budgeted:
        raise InvalidArgumentError("token budgets batch one source's rows, not a mixture's")

    def _spans(self, pass_: Pass, rank: Topology) -> tuple[MixEpoch, list[tuple[int, int]]]:
        world_size, batch_size = pass_.steps
        mix = self.mixture.epoch(
            self.layout,
            pass_.epoch,
            pass_.legs,
            readers=(rank.world_size, rank.num_workers),
            steps=(world_size or rank.world_size, batch_size),
        )
        return mix, self.mixture.spans(mix, rank)

    def rank_streams(self, pass_: Pass, rank: Topology) -> tuple[list[int], list[int]]:
        _, spans = self._spans(pass_, rank)
        counts = [self.layout.batches(b - a) for a, b in spans]
        return counts, consumed(counts, pass_.batches)

    def resolve(self, pass_: Pass, topology: Topology, *, done: int | None = None) -> Stream:
        mix, spans = self._spans(pass_, topology)
        counts = [self.layout.batches(b - a) for a, b in spans]
        done = _done(counts, pass_, topology.worker, done)
        lo, hi = spans[topology.worker]
        begin = lo + min(done * self.layout.batch_size, hi - lo)
        # A stream's rows of each source are a contiguous range of its epoch; a resumed pass
        # starts each at the rows its delivered positions held.
        starts = (mix.current.prefix(begin) - mix.current.prefix(lo)).tolist()
        sources = tuple(
            SourceRows(i, mix.source_epoch(i), runs, sequence_length(runs), starts[i])
            for i, runs in enumerate(mix.source_runs(lo, hi))
        )
        return Stream(
            topology=topology,
            pass_=pass_,
            layout=self.layout,
            sources=sources,
            length=hi - lo,
            batches=counts[topology.worker],
            done=done,
            interleave=mix.current,
            first=lo,
        )

    def rank_batches(self, rank: Topology, epoch: int = 0) -> int:
        turn = max(1, self.layout.seq_tokens)  # (a packed mixture's spans are whole sequences)
        layout = dataclasses.replace(self.layout, batch_size=self.layout.batch_size // turn)
        return strategy_of("equal").rank_batches(self.epoch_rows // turn, rank, layout)


@dataclass(frozen=True, eq=False)
class Budgeted:
    """The streams of ``streams`` (with their length index) read in token-budget batches
    (`planning.budget`).

    The inner streams are cut in groups of ``layout.batch_size`` rows; each group makes the
    batches its rows' lengths need under ``lengths.max_tokens``, as many for group ``m`` of
    every rank's stream of a worker as the most any of them needs, so that every rank yields
    the same batches. Counts come from the length index, for every stream, in every process.
    """

    streams: OneSource
    column: str
    truncate: bool = False
    # The last pass's counts (~0.25 s a million rows): a pass asks for them several times.
    _tables: dict[tuple[Any, ...], list[np.ndarray]] = field(
        default_factory=dict, repr=False, compare=False
    )

    @property
    def layout(self) -> Layout:
        return self.streams.layout

    @property
    def epoch_rows(self) -> int:
        return self.streams.epoch_rows

    @property
    def lengths(self) -> Lengths:
        """The length index."""
        assert self.streams.lengths is not None, "a token budget's streams have lengths"
        return self.streams.lengths

    @property
    def scheduled(self) -> bool:
        return False

    @property
    def skips_carried(self) -> bool:
        return False

    def with_layout(self, layout: Layout) -> Budgeted:
        if layout == self.layout:
            return self
        inner = dataclasses.replace(self.streams, layout=layout)
        return dataclasses.replace(self, streams=inner, _tables={})

    def budgeted(self, lengths: Lengths, column: str, truncate: bool) -> Budgeted:
        raise InvalidArgumentError("these streams are read in token-budget batches already")

    def _table(self, pass_: Pass, rank: Topology, worker: int | None = None) -> list[np.ndarray]:
        """Each worker's groups' batch counts (``worker``: only its own; the others empty)."""
        key = (pass_.epoch, pass_.legs, rank.world_size, rank.num_workers, worker)
        table = self._tables.get(key)
        if table is None:
            self._tables.clear()
            table = self._tables[key] = self._count(pass_, rank, worker)
        return table

    def _count(self, pass_: Pass, rank: Topology, worker: int | None) -> list[np.ndarray]:
        epoch = self.streams.rows(pass_)
        return group_table(
            epoch.sequence,
            self.lengths.in_order(epoch.order),
            self.layout,
            world_size=rank.world_size,
            num_workers=rank.num_workers,
            epoch=pass_.epoch,
            leg=len(pass_.legs),
            max_tokens=self.lengths.max_tokens,
            workers=None if worker is None else [worker],
        )

    def rank_streams(self, pass_: Pass, rank: Topology) -> tuple[list[int], list[int]]:
        counts = [int(t.sum()) for t in self._table(pass_, rank)]
        return counts, consumed(counts, pass_.batches)

    def resolve(self, pass_: Pass, topology: Topology, *, done: int | None = None) -> Stream:
        if done is None and not pass_.batches:
            done = 0  # a fresh pass: this worker's own counts are all it needs
        own = done is not None
        table = self._table(pass_, topology, topology.worker if own else None)
        counts = [int(t.sum()) for t in table]
        mine = table[topology.worker]
        if done is None:
            done = consumed(counts, pass_.batches)[topology.worker]
        groups, skip = split_done(mine, done)
        budget = BudgetPass(
            tuple(int(c) for c in mine[groups:]),
            skip,
            groups,
            self.lengths.max_tokens,
            self.column,
            self.truncate,
        )
        # The inner stream from the group it stopped in, counted in budget batches.
        inner = self.streams.resolve(pass_, topology, done=groups)
        return dataclasses.replace(inner, batches=counts[topology.worker], done=done, budget=budget)

    def rank_batches(self, rank: Topology, epoch: int = 0) -> int:
        table = self._table(Pass(epoch), rank)
        return int(sum(t.sum() for t in table))
