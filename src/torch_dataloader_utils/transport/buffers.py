"""The shared memory messages live in: a worker's pool of buffers, lent to the main process.

A pooled buffer starts with a header whose first byte says whether the main process has given
it back; both processes map the same pages, so the flag needs no other channel. A buffer's
memory crosses to the main process once, with the first message in it: later messages name
it by its serial number (`Received`).
"""

from __future__ import annotations

import itertools
import os
import secrets
import sys
import threading
from typing import Any, NamedTuple

import numpy as np
import torch

from ..errors.on_error import ReadFailure
from ..fs.forks import ProcessLocal
from .memory import POOL_BUFFERS, POOL_GRAIN, Buffer, new_buffer, no_room, room_log

__all__ = [
    "BufferBundle",
    "BufferPool",
    "Lent",
    "Received",
    "Taken",
    "incoming",
    "outgoing",
    "take_buffer",
]

_ALIGN = 64

# The header a pooled buffer starts with (its first byte: the flag the module docstring names).
_HEADER = _ALIGN


_FREE, _IN_USE = 0, 1


def _release(buffer: torch.Tensor) -> None:
    if buffer.numel() >= _HEADER:
        # Through numpy: torch's item assignment costs the main process several times more
        # CPU a message (docs/adr/0016-main-process-share.md).
        buffer.numpy()[0] = _FREE


class Taken(NamedTuple):
    """A pooled buffer marked in use, what pickles as its memory (`memory.Buffer`), its serial
    number in the pool, and the serials of the buffers the pool dropped to make room (the main
    process may forget those)."""

    buffer: torch.Tensor
    carrier: Any
    serial: int
    dropped: tuple[int, ...]


class _Buffers:
    """One process's pooled buffers, and which of them the main process has received."""

    def __init__(self) -> None:
        # Who sends: the process id, and a number of its own (a later process may be given
        # the id of an exited one).
        self.owner = (os.getpid(), secrets.randbits(63))
        self.items: list[tuple[Buffer, int]] = []  # most recently used last
        self.serials = itertools.count()
        # Serials whose memory went out with a message: later ones send only the serial.
        # Read and written by the queue's feeder thread (pickling), trimmed by `take`.
        self.sent: set[int] = set()
        self.lock = threading.Lock()
        # Serials dropped and not yet told to the main process (it unmaps them).
        self.dropped: list[int] = []


class BufferPool:
    """Shared-memory buffers a worker reuses once the main process has released them.

    Args:
        size: buffers kept; when all are in flight a new one is made (and replaces the
            oldest in the pool, which is then freed when the main process drops it). In
            flight at once: the ``prefetch_factor`` (2) messages queued, the one the main
            process hands out batches of, and the one holding the batch the user has.
    """

    def __init__(self, size: int = POOL_BUFFERS) -> None:
        self.size = size
        # Per process: a forked process inherits the pool, whose pages it shares with its
        # parent and siblings: it must never write to them, so it starts afresh.
        self._buffers: ProcessLocal[_Buffers] = ProcessLocal(_Buffers)

    def take(self, nbytes: int) -> Taken | None:
        """A buffer of at least ``_HEADER + nbytes`` bytes, marked in use; None when shared
        memory has no room for one (`memory.new_buffer`)."""
        pool = self._buffers.get()
        items = pool.items
        for i, (made, serial) in enumerate(items):
            # (Through numpy: torch's item access is slower,
            # docs/adr/0020-measurements-behind-constants.md#workers-and-the-transport)
            header = made.tensor.numpy()
            if header[0] == _FREE and made.tensor.numel() >= _HEADER + nbytes:
                items.append(items.pop(i))
                header[0] = _IN_USE
                told, pool.dropped = tuple(pool.dropped), []
                return Taken(made.tensor, made.carrier, serial, told)
        size = _round_up(_HEADER + nbytes, POOL_GRAIN)
        dropped = pool.dropped
        fresh = new_buffer(size)
        if fresh is None:  # free buffers too small hold room: let them go (the main process
            # unmaps them when told, with the next message) so that a later buffer can fit
            freed = [serial for made, serial in items if made.tensor.numpy()[0] == _FREE]
            items[:] = [item for item in items if item[1] not in freed]
            dropped.extend(freed)
        else:
            fresh.tensor.numpy()[0] = _IN_USE
            serial = next(pool.serials)
            items.append((fresh, serial))
            if len(items) > self.size:
                dropped.append(items.pop(0)[1])
        with pool.lock:
            pool.sent.difference_update(dropped)
        if fresh is None:
            return None  # (the dropped serials go with the next message: `told`)
        pool.dropped = []
        return Taken(fresh.tensor, fresh.carrier, serial, tuple(dropped))

    def told(self) -> tuple[int, ...]:
        """The serials dropped and not yet told to the main process, now told (a message
        that carries no pooled buffer carries these)."""
        pool = self._buffers.get()
        told, pool.dropped = tuple(pool.dropped), []
        return told

    def owner(self) -> tuple[int, int]:
        """This process's pool's name in the main process (`Received`): its pid and a nonce."""
        return self._buffers.get().owner

    def first_send(self, serial: int) -> bool:
        """Whether a message about to be sent (pickled) must carry buffer ``serial`` itself:
        true the first time only. Messages of a worker are pickled and received in order, so
        the main process has it by the time a later message names it."""
        pool = self._buffers.get()
        with pool.lock:
            if serial in pool.sent:
                return False
            pool.sent.add(serial)
            return True


class Received:
    """The pooled buffers the main process has received, by worker pool (`BufferPool.owner`)
    and serial.

    Passing a buffer's memory to another process costs the receiver CPU: multiprocessing opens
    a connection to the sender to receive its file descriptor, with an HMAC handshake, for every
    message, even when torch has the memory mapped already. So a buffer's memory crosses once,
    and the main process keeps it mapped until the worker drops it from its pool or exits
    (docs/adr/0020-measurements-behind-constants.md#workers-and-the-transport).
    """

    # Where processes cannot be asked whether they still exist (Windows: os.kill(pid, 0)
    # would signal), every message carries its buffer, as torch does.
    enabled = sys.platform != "win32"

    def __init__(self) -> None:
        self._buffers: dict[tuple[tuple[int, int], int], torch.Tensor] = {}
        self._owners: set[tuple[int, int]] = set()
        self._lock = threading.Lock()
        # Messages that carried their buffer, and that named one received before.
        self.carried = self.named = 0

    def add(
        self, owner: tuple[int, int], serial: int, buffer: torch.Tensor, dropped: tuple[int, ...]
    ) -> None:
        """Keep ``buffer``, serial ``serial`` of ``owner``'s pool; forget its ``dropped`` ones."""
        with self._lock:
            if owner not in self._owners:  # a new worker: the ones that exited are forgotten
                self._forget_exited()
                self._owners.add(owner)
            self.carried += 1
            self._buffers[owner, serial] = buffer
            for old in dropped:
                self._buffers.pop((owner, old), None)

    def get(self, owner: tuple[int, int], serial: int, dropped: tuple[int, ...]) -> torch.Tensor:
        """Buffer ``serial`` of ``owner``'s pool, received with an earlier message."""
        with self._lock:
            for old in dropped:
                self._buffers.pop((owner, old), None)
            buffer = self._buffers.get((owner, serial))
            self.named += 1
        if buffer is None:
            raise RuntimeError(
                f"a message of worker process {owner[0]} names its shared buffer {serial}, which "
                "the message that carried it never delivered (see the worker's output for an "
                "error while sending)"
            )
        return buffer

    def forget(self, owner: tuple[int, int], dropped: tuple[int, ...]) -> None:
        """Unmap ``owner``'s ``dropped`` buffers (told by a message that carried none)."""
        with self._lock:
            for old in dropped:
                self._buffers.pop((owner, old), None)

    def forget_exited(self) -> None:
        """Unmap the buffers of worker processes that have exited."""
        with self._lock:
            self._forget_exited()

    def _forget_exited(self) -> None:
        gone = {owner for owner in self._owners if not _exists(owner[0])}
        if gone:
            self._owners -= gone
            self._buffers = {k: v for k, v in self._buffers.items() if k[0] not in gone}

    def __len__(self) -> int:
        return len(self._buffers)


def _exists(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process now has the number: ours has exited
        return False
    return True


class Lent:
    """Shared buffers whose bytes the main process handed out as views (the batches of a
    bundle): each goes back to its worker's pool (`_release`) once nothing views it.

    The views come from a storage of their own over the buffer's memory (`lend`), so its use
    count is the views' alone: torch's cache of shared mappings, the bundle and `Unbundler`'s
    list of recent buffers hold the buffer's own storage, not this one. Whether the views are
    gone is checked whenever a bundle is lent (`settle`): the user usually drops a batch
    before asking for the next, so a buffer goes back a batch or two after its last one.
    """

    # Lent buffers followed at most; older ones are forgotten (never reused: their worker's
    # pool made others meanwhile) so that a program keeping every batch costs no more a bundle.
    size = 64

    def __init__(self) -> None:
        self._lent: list[tuple[torch.Tensor, torch.Tensor, int]] = []
        self._lock = threading.Lock()

    def lend(self, buffer: torch.Tensor) -> torch.Tensor | None:
        """A tensor over ``buffer``'s memory to hand out views of; ``buffer`` is released
        once no view of it is left. None when torch gives no use count: the caller
        copies instead (a buffer lent then could never be released)."""
        own = torch.from_numpy(buffer.numpy())  # a storage of its own, the same memory
        base = _use_count(own)
        if base is None:
            return None
        with self._lock:
            self._lent.append((own, buffer, base))
            if len(self._lent) > self.size:
                self._lent.pop(0)
        return own

    def settle(self) -> None:
        """Release every lent buffer nothing views any more."""
        with self._lock:
            kept = []
            for own, buffer, base in self._lent:
                count = _use_count(own)
                if count is not None and count <= base:
                    _release(buffer)
                else:
                    kept.append((own, buffer, base))
            self._lent = kept


def _use_count(tensor: torch.Tensor) -> int | None:
    # How many tensors (views) share the storage. A private torch function: when it is
    # missing, None, and the landing never reuses a region (only slower).
    counter = getattr(torch._C, "_storage_Use_Count", None)
    if counter is None:
        return None
    return int(counter(tensor.untyped_storage()._cdata))


def take_buffer(nbytes: int) -> tuple[Taken, bool]:
    """A pooled buffer for a message of ``nbytes`` (after the header), and True; where no
    shared memory has room, a private one and False (sent as bytes: one copy more), which
    carries the serials the pool dropped meanwhile."""
    taken = _pool.take(nbytes)
    if taken is not None:
        return taken, True
    room_log(
        "pipe",
        f"{no_room(_HEADER + nbytes)}: bundles that do not fit go through the pipe (one copy more)",
    )
    return Taken(torch.empty(_HEADER + nbytes, dtype=torch.uint8), None, -1, _pool.told()), False


Carried = tuple[Any, "tuple[int, int] | None", int, tuple[int, ...]]


def outgoing(
    buffer: torch.Tensor,
    end: int,
    *,
    pooled: bool,
    serial: int | None,
    carrier: Any,
    dropped: tuple[int, ...],
) -> Carried:
    """What a message pickles for its buffer (its first ``end`` bytes): the bytes of a private
    one; a pooled one's memory the first time it is sent, later its serial (`Received`);
    with the pool's name and the serials it dropped. `incoming` undoes it."""
    if not pooled:  # no shared memory had room: the bytes go through the pipe
        owner = _pool.owner() if dropped else None  # (it tells the pool's drops)
        return buffer.numpy()[:end], owner, 0, dropped
    if serial is None or not _received.enabled:
        return carrier, None, 0, ()
    carried = carrier if _pool.first_send(serial) else None
    return carried, _pool.owner(), serial, dropped


def incoming(
    memory: torch.Tensor | np.ndarray | None,
    owner: tuple[int, int] | None,
    serial: int,
    dropped: tuple[int, ...],
) -> tuple[torch.Tensor, bool]:
    """The buffer a message names (`outgoing`), and whether it is a worker pool's."""
    if isinstance(memory, np.ndarray):  # (bytes sent through the pipe: private)
        if owner is not None:
            _received.forget(owner, dropped)
        return torch.from_numpy(memory), False
    if owner is not None:  # a pooled buffer: received once, then named by its serial
        if memory is None:
            memory = _received.get(owner, serial, dropped)
        else:
            _received.add(owner, serial, memory, dropped)
    assert memory is not None
    return memory, True


def _round_up(n: int, grain: int) -> int:
    return -(-n // grain) * grain


_lent = Lent()


_received = Received()


_pool = BufferPool()


class BufferBundle:
    """A worker's bundle whose data lies in one buffer (``end`` bytes of it): a pooled shared
    one, or a private one no shared memory had room for (`outgoing` says how each pickles).
    `wire.PackedBundle` (torch batches) and `ipc.ArrowBundle` (Arrow IPC streams) add where
    their outputs lie in it."""

    __slots__ = ("buffer", "carrier", "dropped", "end", "failures", "pooled", "serial", "worker")

    def __init__(
        self,
        buffer: torch.Tensor,
        end: int,
        worker: int = -1,
        *,
        serial: int | None = None,
        dropped: tuple[int, ...] = (),
        carrier: Any = None,
        pooled: bool = False,
    ) -> None:
        self.buffer = buffer
        self.end = end
        self.worker = worker  # the DataLoader worker that sent it
        self.failures: tuple[ReadFailure, ...] = ()  # reads skipped since the last message
        self.serial = serial  # in this process's BufferPool; None once received
        self.dropped = dropped  # serials the pool dropped when it took this buffer
        self.carrier = carrier  # what pickles as the buffer's memory (`memory.Buffer`)
        self.pooled = pooled  # a worker pool's buffer: given back when no longer viewed

    def carried(self) -> Carried:
        """What this bundle pickles for its buffer (`outgoing`)."""
        return outgoing(
            self.buffer,
            self.end,
            pooled=self.pooled,
            serial=self.serial,
            carrier=self.carrier,
            dropped=self.dropped,
        )
