"""Where a reader sits: its data-parallel rank and its DataLoader worker."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import torch.distributed as dist
from torch.utils.data import get_worker_info

from ..errors import InvalidArgumentError

__all__ = ["Ranks", "Topology", "resolve_rank"]


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


@dataclass
class Ranks:
    """How one dataset finds the data-parallel rank of the process it is used in.

    Explicit ``rank``/``world_size`` win; then the process's ``torch.distributed`` group; then
    the rank of the process this copy was pickled in (a spawned DataLoader worker has no group
    of its own); then ``RANK``/``WORLD_SIZE``; else a single rank.

    Attributes:
        rank: the explicit rank, if any.
        world_size: the explicit world size, if any.
        inherited: the rank resolved where this copy was pickled (``None``: none there).
    """

    rank: int | None = None
    world_size: int | None = None
    inherited: tuple[int, int] | None = None

    def __post_init__(self) -> None:
        if self.rank is not None or self.world_size is not None:
            resolve_rank(self.rank, self.world_size)  # validate now, before any worker starts
            Topology(self.rank or 0, self.world_size or 1)

    @property
    def explicit(self) -> bool:
        """Whether the rank was given (not resolved from the environment)."""
        return self.rank is not None or self.world_size is not None

    def resolve(self) -> tuple[int, int]:
        """``(rank, world_size)`` of the calling process, resolved now."""
        if self.explicit:
            return resolve_rank(self.rank, self.world_size)
        if dist.is_available() and dist.is_initialized():
            return dist.get_rank(), dist.get_world_size()
        if self.inherited is not None:
            return self.inherited
        return resolve_rank(None, None)

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        if not self.explicit:
            # Pickled for a spawned DataLoader worker, which will not have this process's
            # torch.distributed group: it takes the rank resolved here. A process with no rank
            # (no group, no RANK: the parent of mp.spawn, ddp_spawn or Ray ranks) leaves the
            # rank to be resolved where the copy lands.
            has_rank = (dist.is_available() and dist.is_initialized()) or "RANK" in os.environ
            state["inherited"] = self.resolve() if has_rank else self.inherited
        return state
