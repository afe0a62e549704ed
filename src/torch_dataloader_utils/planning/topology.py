"""Where a reader sits: its data-parallel rank and its DataLoader worker."""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch.distributed as dist
from torch.utils.data import get_worker_info

from ..errors import InvalidArgumentError

__all__ = ["Topology", "resolve_rank"]


@dataclass(frozen=True, slots=True)
class Topology:
    """Rank and worker of one stream.

    Attributes:
        rank: data-parallel rank.
        world_size: data-parallel ranks.
        worker: DataLoader worker id inside the rank (0 in the main process).
        num_workers: DataLoader workers of the rank (1 when reading in the main process).
    """

    rank: int = 0
    world_size: int = 1
    worker: int = 0
    num_workers: int = 1

    def __post_init__(self) -> None:
        if not 0 <= self.rank < self.world_size:
            raise InvalidArgumentError(f"rank {self.rank} is outside world_size {self.world_size}")
        if not 0 <= self.worker < self.num_workers:
            raise InvalidArgumentError(f"worker {self.worker} is outside {self.num_workers}")

    @property
    def num_streams(self) -> int:
        """Streams in the whole job: ranks times workers."""
        return self.world_size * self.num_workers

    @property
    def stream(self) -> int:
        """This stream's id, rank-major."""
        return self.rank * self.num_workers + self.worker

    def with_worker(self) -> Topology:
        """This topology with the worker taken from ``get_worker_info()`` of this process."""
        info = get_worker_info()
        if info is None:
            return Topology(self.rank, self.world_size, 0, 1)
        return Topology(self.rank, self.world_size, info.id, info.num_workers)


def resolve_rank(rank: int | None = None, world_size: int | None = None) -> tuple[int, int]:
    """The data-parallel ``(rank, world_size)`` of this process.

    Explicit arguments win; then an initialised ``torch.distributed`` process group; then the
    ``RANK``/``WORLD_SIZE`` environment variables torchrun sets; else a single rank.

    Raises:
        InvalidArgumentError: only one of ``rank``/``world_size`` is given, or they disagree.
    """
    if rank is not None or world_size is not None:
        if rank is None or world_size is None:
            raise InvalidArgumentError("pass both rank= and world_size=, or neither")
        return rank, world_size
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    if "WORLD_SIZE" in os.environ:
        return int(os.environ.get("RANK", "0")), int(os.environ["WORLD_SIZE"])
    return 0, 1
