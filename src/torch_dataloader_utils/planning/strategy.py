"""How an epoch's rows are split into streams: one object per ``split_strategy`` (pure).

- `EqualStreams` (``"equal"``, the model of docs/concepts/model.md): the epoch's row sequence
  cut into equal spans per rank, then batch-aligned spans per worker. Equal batch counts on
  every rank; elastic resume.
- `RoundRobinChunks` (``"round_robin"``, the earlier library's): whole chunks dealt to the
  streams in turn. Every row once, but streams (and ranks) are unequal.

A strategy answers two questions for a pass: the runs of the epoch's sequence a stream reads
(`Strategy.runs`), and how many rows each stream of a rank holds (`Strategy.stream_rows`), which
the main process needs to put the workers' batches in order and to resume. The workers and the
brute-force tests of `assign_stream` run the same code. A new strategy (weighted sources, say)
subclasses `Strategy` and is added to `STRATEGIES`.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import ClassVar

import numpy as np

from ..errors import InvalidArgumentError
from .assign import SPLIT_STRATEGIES, Piece, Remainder, SplitStrategy, rank_span
from .layout import Layout
from .resume import Leg, epoch_sequence, stream_spans
from .sequence import (
    DocumentRest,
    Item,
    Run,
    round_robin_runs,
    run_pieces,
    sequence_length,
    stream_runs,
)
from .shuffle import chunk_order
from .topology import Ranks, Topology

__all__ = [
    "STRATEGIES",
    "EpochRows",
    "EqualStreams",
    "RoundRobinChunks",
    "Strategy",
    "assign_stream",
    "strategy_of",
]


@dataclass(frozen=True, eq=False)
class EpochRows:
    """The rows a pass over an epoch reads: the chunk order and, after elastic resumes, what
    earlier legs left. Each is computed when first asked for.

    Attributes:
        chunk_rows: rows of each chunk, in plan order.
        epoch: the epoch.
        legs: earlier legs of the epoch (each an elastic resume's old topology).
        layout: the current leg's layout.
    """

    chunk_rows: Sequence[int] | np.ndarray
    epoch: int
    legs: tuple[Leg, ...]
    layout: Layout

    @cached_property
    def order(self) -> np.ndarray:
        """Chunk numbers in the epoch's order (the first leg's seed and shuffle fix it)."""
        first = self.legs[0].layout if self.legs else self.layout
        order = chunk_order(
            len(self.chunk_rows), seed=first.seed, epoch=self.epoch, shuffle=first.shuffle
        )
        out: np.ndarray = np.asarray(order, dtype=np.int64)
        return out

    @cached_property
    def rows(self) -> np.ndarray:
        """Rows of each chunk, in the epoch's order."""
        rows: np.ndarray = np.asarray(self.chunk_rows, dtype=np.int64)[self.order]
        return rows

    @cached_property
    def ends(self) -> np.ndarray:
        """Where each chunk ends in the epoch's row sequence (``cumsum(rows)``)."""
        return np.cumsum(self.rows)

    @cached_property
    def sequence(self) -> list[Item]:
        """The runs of the global row sequence this leg reads (one run in a fresh epoch)."""
        total = int(self.ends[-1]) if len(self.ends) else 0
        return epoch_sequence(total, self.legs, epoch=self.epoch)

    def pieces(self, runs: Sequence[Run]) -> list[Piece]:
        """The pieces of chunks that hold ``runs`` (a fresh pass's runs take whole pieces)."""
        return [p for run in runs for p in self.run_pieces(run)[0]]

    def run_pieces(self, run: Run) -> tuple[list[Piece], np.ndarray | DocumentRest | None]:
        """The pieces that hold ``run``, and which of their rows it takes (``None``: all)."""
        return run_pieces(run, self.rows, self.order, ends=self.ends)


class Strategy(ABC):
    """How the streams of a pass divide the epoch's rows.

    Attributes:
        name: the ``split_strategy`` value.
        batch_aligned: every stream holds whole batches but a rank's last (``drop_last`` acts
            on the rank's span); otherwise each stream's last short batch is its own.
    """

    name: ClassVar[SplitStrategy]
    batch_aligned: ClassVar[bool]

    @abstractmethod
    def runs(self, epoch: EpochRows, topology: Topology) -> list[Run]:
        """The runs of ``epoch``'s sequence that ``topology``'s stream reads, in order."""

    def stream_rows(self, epoch: EpochRows, rank: Topology) -> list[int]:
        """Rows of each stream of ``rank`` (one per worker of its ``num_workers``)."""
        return [sequence_length(self.runs(epoch, stream)) for stream in _workers(rank)]

    @abstractmethod
    def rank_batches(self, total: int, rank: Topology, layout: Layout) -> int:
        """Batches ``rank`` yields in a fresh epoch of ``total`` rows, whatever its workers.

        Raises:
            TypeError: the count depends on the number of workers.
        """

    def check(self, layout: Layout, ranks: Ranks) -> None:  # noqa: B027 - optional hook
        """Refuse a layout this strategy cannot serve on the ranks ``ranks`` finds."""


class EqualStreams(Strategy):
    """The model: equal spans per rank, batch-aligned spans per worker, cut at rows."""

    name = "equal"
    batch_aligned = True

    def runs(self, epoch: EpochRows, topology: Topology) -> list[Run]:
        layout = epoch.layout
        return stream_runs(
            epoch.sequence,
            topology,
            batch_size=layout.batch_size,
            drop_last=layout.drop_last,
            remainder=layout.remainder,
        )

    def stream_rows(self, epoch: EpochRows, rank: Topology) -> list[int]:
        # From the sequence's length alone: a resumed leg's runs stay deferred.
        spans = stream_spans(
            sequence_length(epoch.sequence),
            rank=rank.rank,
            world_size=rank.world_size,
            num_workers=rank.num_workers,
            layout=epoch.layout,
        )
        return [b - a for a, b in spans]

    def rank_batches(self, total: int, rank: Topology, layout: Layout) -> int:
        start, stop = rank_span(
            total,
            rank=rank.rank,
            world_size=rank.world_size,
            batch_size=layout.batch_size,
            drop_last=layout.drop_last,
            remainder=layout.remainder,
        )
        return -(-(stop - start) // layout.batch_size)


class RoundRobinChunks(Strategy):
    """The earlier library's split: whole chunks dealt to the streams in turn (unequal)."""

    name = "round_robin"
    batch_aligned = False

    def runs(self, epoch: EpochRows, topology: Topology) -> list[Run]:
        return round_robin_runs(epoch.rows, topology, ends=epoch.ends)

    def rank_batches(self, total: int, rank: Topology, layout: Layout) -> int:
        raise TypeError('the number of batches depends on the workers with "round_robin"')

    def check(self, layout: Layout, ranks: Ranks) -> None:
        if layout.remainder != "uneven" and ranks.resolve()[1] > 1:
            raise InvalidArgumentError(
                'split_strategy="round_robin" with several ranks: it deals whole chunks, so '
                "ranks get unequal batch counts, which hangs DDP at the last collective. Use "
                'the default split_strategy="equal", or pass remainder="uneven" to accept '
                "unequal ranks (and use join())"
            )


STRATEGIES: dict[str, Strategy] = {s.name: s for s in (EqualStreams(), RoundRobinChunks())}


def strategy_of(name: str) -> Strategy:
    """The strategy of a ``split_strategy`` value.

    Raises:
        InvalidArgumentError: no strategy has that name.
    """
    try:
        return STRATEGIES[name]
    except (KeyError, TypeError):
        raise InvalidArgumentError(
            f"split_strategy must be one of {SPLIT_STRATEGIES}, got {name!r}"
        ) from None


def _workers(rank: Topology) -> list[Topology]:
    return [
        Topology(rank.rank, rank.world_size, w, rank.num_workers) for w in range(rank.num_workers)
    ]


def assign_stream(
    chunk_rows: Sequence[int],
    topology: Topology,
    *,
    epoch: int,
    seed: int,
    shuffle: bool,
    batch_size: int,
    drop_last: bool = False,
    remainder: Remainder = "drop",
    strategy: SplitStrategy = "equal",
) -> list[Piece]:
    """The pieces one stream reads in a fresh pass over ``epoch``, in reading order.

    The same code the workers run (`EpochRows`, `Strategy.runs`), for tests and tools.

    Args:
        chunk_rows: rows of each chunk, in plan order.
        topology: rank, world size, worker and workers of the stream.
        epoch: the epoch (chunks are permuted by ``(seed, epoch)`` when ``shuffle``).
        seed: the shuffle seed.
        shuffle: permute chunks per epoch.
        batch_size: rows per batch (streams are batch-aligned).
        drop_last: trim each rank's span to whole batches.
        remainder: what to do with the rows that do not divide among ranks.
        strategy: ``"equal"`` (the model: equal streams cut at rows) or ``"round_robin"`` (the
            earlier library's: whole chunks dealt to streams in turn; every row once, but
            streams, and so ranks' batch counts, are unequal: not for DDP without ``join()``).
    """
    split = strategy_of(strategy)
    layout = Layout(
        batch_size=batch_size,
        shuffle=shuffle,
        seed=seed,
        drop_last=drop_last,
        remainder=remainder,
        block_rows=batch_size,
        first_block_rows=batch_size,
        strategy=strategy,
    )
    rows = EpochRows(chunk_rows, epoch, (), layout)
    return rows.pieces(split.runs(rows, topology))
