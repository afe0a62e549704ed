"""Which rows a worker's stream reads in a pass, and where it starts: the one resolver.

The workers (`StructuredDataset.__iter__`), the main process (to put the workers' batches in
DataLoader order and to count a rank's batches) and `planning.assign_stream` all go through the
`Strategy` of the layout; this module adds the pass (epoch, earlier legs, batches delivered).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from ..planning import (
    EpochRows,
    Iteration,
    Layout,
    Run,
    Topology,
    consumed,
    sequence_length,
    strategy_of,
)

__all__ = ["Stream", "rank_streams", "resolve"]


@dataclass(frozen=True, eq=False)
class Stream:
    """One stream of one pass.

    Attributes:
        topology: the rank and worker that read it.
        iteration: the pass.
        epoch: the epoch's rows (chunk order, sequence).
        runs: the runs of the epoch's sequence the stream reads, in order.
        length: rows in ``runs``.
        batches: batches the stream yields in the pass, from its start.
        done: batches it delivered before this pass began (a resume starts there).
    """

    topology: Topology
    iteration: Iteration
    epoch: EpochRows
    runs: list[Run]
    length: int
    batches: int
    done: int

    @property
    def start(self) -> int:
        """The stream row the pass starts at."""
        return min(self.done * self.epoch.layout.batch_size, self.length)


def _epoch(
    chunk_rows: Sequence[int] | np.ndarray, layout: Layout, iteration: Iteration
) -> EpochRows:
    return EpochRows(chunk_rows, iteration.epoch, iteration.legs, layout)


def rank_streams(
    chunk_rows: Sequence[int] | np.ndarray, layout: Layout, iteration: Iteration, rank: Topology
) -> tuple[list[int], list[int]]:
    """Batches of each stream of ``rank`` (one per worker of its ``num_workers``) in
    ``iteration``, and how many each delivered before it began."""
    epoch = _epoch(chunk_rows, layout, iteration)
    rows = strategy_of(layout.strategy).stream_rows(epoch, rank)
    counts = [layout.batches(n) for n in rows]
    return counts, consumed(counts, iteration.batches)


def resolve(
    chunk_rows: Sequence[int] | np.ndarray,
    layout: Layout,
    iteration: Iteration,
    topology: Topology,
    *,
    done: int | None = None,
) -> Stream:
    """The stream ``topology`` reads in ``iteration``.

    ``done``: batches the stream already delivered (a worker's own saved state); by default,
    its share of the batches its rank delivered (``iteration.batches``, in DataLoader order).
    """
    epoch = _epoch(chunk_rows, layout, iteration)
    strategy = strategy_of(layout.strategy)
    counts = [layout.batches(n) for n in strategy.stream_rows(epoch, topology)]
    if done is None:
        done = consumed(counts, iteration.batches)[topology.worker]
    runs = strategy.runs(epoch, topology)
    return Stream(
        topology=topology,
        iteration=iteration,
        epoch=epoch,
        runs=runs,
        length=sequence_length(runs),
        batches=counts[topology.worker],
        done=done,
    )
