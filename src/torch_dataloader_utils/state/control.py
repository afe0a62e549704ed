"""Pass control: the epoch and pass counters one rank's copies of a dataset share.

See ADR 0009 for the epoch rule.
"""

from __future__ import annotations

import multiprocessing
import os

import torch
from torch.utils.data import get_worker_info

__all__ = ["WORKER_SLOTS", "PassControl"]

# Slots of the shared control tensor.
_EPOCH = 0  # the epoch set, or of the pass begun last
_GENERATION = 1  # passes begun by the main process
_ADVANCE = 2  # 1: the next pass reads _EPOCH + 1 (a pass delivered a batch since set_epoch)
_FOR_WORKERS = 3  # passes the main process began for its DataLoader workers to follow
WORKER_SLOTS = 256
_NEXT = 4  # per worker: 1 + the epoch its next pass of its own reads (0: unset)
_FOLLOWED = _NEXT + WORKER_SLOTS  # per worker: the last _FOR_WORKERS pass it followed


class PassControl:
    """The epoch and the pass counters that one rank's copies of a dataset share.

    The main process and its DataLoader workers (fork, spawn or forkserver, persistent or not)
    see one tensor in shared memory, so ``set_epoch`` reaches persistent workers and workers
    of a plain ``DataLoader`` learn which epoch their pass reads. The rule (ADR 0009):

    - ``set_epoch(e)``: the next pass reads epoch ``e``; an explicit epoch always wins.
    - A pass that begins without ``set_epoch`` since a pass that delivered a batch reads the
      next epoch (as MosaicML Streaming does): a trainer that never calls ``set_epoch``
      (Lightning, a plain loop) still gets a new order each epoch.

    The tensor belongs to one process (its owner). A copy that lands in another process's main
    role (a loader pickled or forked into a rank by ``mp.spawn``, Lightning's ``ddp_spawn`` or Ray)
    takes counters of its own at first use; a DataLoader worker uses its parent's, and private
    ones when its parent never claimed them, so two ranks never share pass counters.
    """

    def __init__(self) -> None:
        self._tensor = self._new(torch.zeros(_NEXT + 2 * WORKER_SLOTS, dtype=torch.int64))
        self._owner = os.getpid()

    @staticmethod
    def _new(values: torch.Tensor) -> torch.Tensor:
        shared: torch.Tensor = values.share_memory_()  # type: ignore[no-untyped-call]
        return shared

    def _values(self) -> torch.Tensor:
        pid = os.getpid()
        if self._owner == pid:
            return self._tensor
        if get_worker_info() is None:
            # Main role in a process that did not create these counters: take our own.
            self._tensor, self._owner = self._new(self._tensor.clone()), pid
            return self._tensor
        parent = multiprocessing.parent_process()
        if parent is None or parent.pid != self._owner:
            # A worker whose rank never touched the counters it received (a dataset pickled
            # into a rank and wrapped in a plain DataLoader): private, not a sibling rank's.
            self._tensor, self._owner = self._tensor.clone(), pid
        return self._tensor

    @property
    def epoch(self) -> int:
        """The epoch set, or of the pass begun last."""
        return int(self._values()[_EPOCH])

    @property
    def generation(self) -> int:
        """Passes the main process has begun."""
        return int(self._values()[_GENERATION])

    def set_epoch(self, epoch: int, *, advance: bool = False) -> None:
        """The next pass reads ``epoch`` (``epoch + 1`` with ``advance``)."""
        values = self._values()
        values[_EPOCH] = epoch
        values[_ADVANCE] = int(advance)
        values[_NEXT:_FOLLOWED] = 0

    def begin(self, *, for_workers: bool) -> tuple[int, int]:
        """Begin a pass in the main process: its epoch and generation.

        ``for_workers``: its DataLoader workers follow this pass (a `TabularDataLoader`'s).
        """
        values = self._values()
        if int(values[_ADVANCE]):
            values[_EPOCH] += 1
            values[_ADVANCE] = 0
            values[_NEXT:_FOLLOWED] = 0
        values[_GENERATION] += 1
        if for_workers:
            values[_FOR_WORKERS] += 1
        return int(values[_EPOCH]), int(values[_GENERATION])

    def delivered(self) -> None:
        """A pass delivered a batch: the next pass reads the next epoch unless set_epoch."""
        self._values()[_ADVANCE] = 1

    def begin_worker(self, worker: int, epoch: int | None = None) -> int | None:
        """Begin a pass in DataLoader worker ``worker``: its epoch, or None to follow the pass
        the main process began for its workers.

        ``epoch`` (a loaded worker state) wins. A worker of a plain ``DataLoader`` (no main
        process begins its passes) reads the epoch after its own last pass, else the main
        process's next one. Each worker writes only its own slots.
        """
        values = self._values()
        if not 0 <= worker < WORKER_SLOTS:
            if epoch is None and int(values[_FOR_WORKERS]):
                return None
            return int(values[_EPOCH]) + int(values[_ADVANCE]) if epoch is None else epoch
        passes = int(values[_FOR_WORKERS])
        if epoch is None and passes != int(values[_FOLLOWED + worker]):
            values[_FOLLOWED + worker] = passes
            return None
        if epoch is None:
            following = int(values[_NEXT + worker])
            epoch = following - 1 if following else int(values[_EPOCH]) + int(values[_ADVANCE])
        values[_NEXT + worker] = epoch + 2
        return epoch
