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
        return _checked(rank, world_size, "rank=/world_size=")
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    env_rank, env_world = os.environ.get("RANK"), os.environ.get("WORLD_SIZE")
    if env_rank is None and env_world is None:
        return 0, 1
    if env_rank is None or env_world is None:
        raise InvalidArgumentError(
            f"RANK={env_rank} and WORLD_SIZE={env_world}: set both (torchrun does), or neither"
        )
    try:
        return _checked(int(env_rank), int(env_world), "RANK/WORLD_SIZE")
    except ValueError as exc:
        if isinstance(exc, InvalidArgumentError):
            raise
        raise InvalidArgumentError(
            f"RANK={env_rank!r} and WORLD_SIZE={env_world!r} must be integers"
        ) from exc


def _checked(rank: int, world_size: int, source: str) -> tuple[int, int]:
    if world_size < 1 or not 0 <= rank < world_size:
        raise InvalidArgumentError(f"{source}: rank {rank} is not in [0, world_size={world_size})")
    return rank, world_size
