"""A dataset's batches made in this process for a measurement (`batches_here`): what
``num_workers="auto"`` times (`metrics.workers`) before the loader starts. Nothing of the
loader's state moves: the rank's stream is read from the start of the epoch and dropped."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from ..planning import Pass, Topology
from ..transport import worker_messages
from .base import PlannedDataset

__all__ = ["batches_here"]


def batches_here(dataset: PlannedDataset) -> Iterator[Any]:
    """The rank's batches of its current epoch, as one in-process stream would make them."""
    rank, world_size = dataset.resolved_rank()
    stream = dataset.streams.resolve(Pass(dataset.passes.epoch), Topology(rank, world_size), done=0)
    return worker_messages(
        dataset._segments(stream),
        dataset.converter,
        dataset._collate,
        worker=0,
        batch_size=dataset.options.batch_size,
    )
