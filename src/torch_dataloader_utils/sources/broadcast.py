"""Planning once per job: rank 0 plans and the other ranks receive the plan."""

from __future__ import annotations

import logging
import pickle
from collections.abc import Callable
from typing import Any, TypeVar, cast

import torch.distributed as dist

__all__ = ["plan_once"]

logger = logging.getLogger(__name__)
T = TypeVar("T")


def plan_once(make: Callable[[], T], *, explicit: bool) -> T:
    """``make()`` on rank 0, broadcast to every rank of the default process group.

    Listing files and reading footers once instead of once per rank spares the storage (and,
    with many ranks, the planning time); every rank gets the same plan by construction. It
    applies when ``torch.distributed`` is initialised and the rank was not passed explicitly
    (explicit ranks may be a data-parallel subgroup that not every process builds). Every rank
    of the group must build the dataset, as every rank of a DDP job does.

    An error on rank 0 is raised on every rank, so no rank is left waiting.
    """
    if explicit or not (dist.is_available() and dist.is_initialized()):
        return make()
    if dist.get_world_size() == 1:
        return make()
    box: list[object] = [None]
    if dist.get_rank() == 0:
        try:
            box[0] = ("ok", make())
        except Exception as exc:
            box[0] = ("error", _portable(exc))
            dist.broadcast_object_list(box, src=0)
            raise
        dist.broadcast_object_list(box, src=0)
        logger.debug("plan broadcast from rank 0")
    else:
        dist.broadcast_object_list(box, src=0)
    kind, value = cast(tuple[str, Any], box[0])
    if kind == "error":
        raise value
    return cast(T, value)


def _portable(exc: Exception) -> Exception:
    """``exc`` if it pickles, else a RuntimeError with its message."""
    try:
        pickle.dumps(exc)
    except Exception:
        return RuntimeError(f"planning failed on rank 0: {type(exc).__name__}: {exc}")
    return exc
