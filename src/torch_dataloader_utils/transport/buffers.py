"""The shared memory messages live in: a worker's pool of buffers, lent to the main process.

A pooled buffer starts with a header whose first byte says whether the main process has given
it back; both processes map the same pages, so the flag needs no other channel.
"""

from __future__ import annotations

import threading

import torch

from ..fs.forks import ProcessLocal

__all__ = ["BufferPool", "Lent"]

_ALIGN = 64


# A pooled buffer starts with a header; its first byte says whether the main process has
# given it back. Both processes map the same pages, so the flag needs no other channel.
_HEADER = _ALIGN


_FREE, _IN_USE = 0, 1


def _new_shared(nbytes: int) -> torch.Tensor:
    new_shared = getattr(torch.UntypedStorage, "_new_shared", None)
    if new_shared is None:  # private in torch: fall back to the public (one more copy) way
        shared: torch.Tensor = torch.empty(nbytes, dtype=torch.uint8)
        return shared.share_memory_()  # type: ignore[no-untyped-call,no-any-return]
    return torch.empty(0, dtype=torch.uint8).set_(new_shared(nbytes))


def _is_shared(tensor: torch.Tensor) -> bool:
    return bool(tensor.untyped_storage().is_shared())  # (Tensor.is_shared: 16x slower)


def _release(buffer: torch.Tensor) -> None:
    if _is_shared(buffer) and buffer.numel() >= _HEADER:
        buffer[0] = _FREE


class BufferPool:
    """Shared-memory buffers a worker reuses once the main process has released them.

    Args:
        size: buffers kept; when all are in flight a new one is made (and replaces the
            oldest in the pool, which is then freed when the main process drops it). In
            flight at once: the ``prefetch_factor`` (2) messages queued, the one the main
            process hands out batches of, and the one holding the batch the user has.
    """

    def __init__(self, size: int = 6) -> None:
        self.size = size
        # Per process: a forked process inherits the pool, whose pages it shares with its
        # parent and siblings: it must never write to them, so it starts afresh.
        self._buffers: ProcessLocal[list[torch.Tensor]] = ProcessLocal(list)

    def take(self, nbytes: int) -> torch.Tensor:
        """A buffer of at least ``_HEADER + nbytes`` bytes, marked in use."""
        buffers = self._buffers.get()
        for i, buffer in enumerate(buffers):
            if int(buffer[0]) == _FREE and buffer.numel() >= _HEADER + nbytes:
                buffers.append(buffers.pop(i))  # most recently used last
                buffer[0] = _IN_USE
                return buffer
        # Round up so that a slightly larger next message still fits.
        buffer = _new_shared(_round_up(_HEADER + nbytes, _POOL_GRAIN))
        buffer[0] = _IN_USE
        buffers.append(buffer)
        if len(buffers) > self.size:
            buffers.pop(0)
        return buffer


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


def _round_up(n: int, grain: int) -> int:
    return -(-n // grain) * grain


_POOL_GRAIN = 1 << 20


_lent = Lent()


_pool = BufferPool()
