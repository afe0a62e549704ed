"""The shared memory messages live in: a worker's pool of buffers, the main process's landing.

A pooled buffer starts with a header whose first byte says whether the main process has given
it back; both processes map the same pages, so the flag needs no other channel.
"""

from __future__ import annotations

import threading

import torch

from ..fs.forks import ProcessLocal

__all__ = ["BufferPool", "Landing"]

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
    return bool(tensor.is_shared())  # type: ignore[no-untyped-call]


def _release(buffer: torch.Tensor) -> None:
    if _is_shared(buffer) and buffer.numel() >= _HEADER:
        buffer[0] = _FREE


class BufferPool:
    """Shared-memory buffers a worker reuses once the main process has released them.

    Args:
        size: buffers kept; when all are in flight a new one is made (and replaces the
            oldest in the pool, which is then freed when the main process drops it).
    """

    def __init__(self, size: int = 4) -> None:
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


class Landing:
    """Private memory of the main process that unpacked batches are views of.

    A region is reused once the user has dropped every batch that views it (its storage has
    no other reference). Fresh allocations fault in fresh pages: a per-batch ``clone`` ran
    ~10x slower than ``memcpy`` here (measured), one ``clone`` per bundle ~4x slower.
    """

    def __init__(self, size: int = 4) -> None:
        self.size = size
        self._regions: list[tuple[torch.Tensor, int]] = []
        self._lock = threading.Lock()

    def take(self, nbytes: int) -> torch.Tensor:
        """A view of ``nbytes`` bytes of a region that nothing else references.

        The returned view itself marks the region in use (loaders iterated in several threads
        of one process share the landing).
        """
        with self._lock:
            for i, (region, alone) in enumerate(self._regions):
                count = _use_count(region)
                if region.numel() >= nbytes and count is not None and count == alone:
                    self._regions.append(self._regions.pop(i))
                    return region[:nbytes]
            region = torch.empty(_round_up(nbytes, _POOL_GRAIN), dtype=torch.uint8)
            base = _use_count(region)
            if base is not None:  # without a use count a region is never reused
                self._regions.append((region, base))
                if len(self._regions) > self.size:
                    self._regions.pop(0)
            return region[:nbytes]


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


_landing = Landing()


_pool = BufferPool()
