"""What a cache did, counted over the main process and its DataLoader workers."""

from __future__ import annotations

import dataclasses
import threading
from dataclasses import dataclass

import torch
from torch.utils.data import get_worker_info

from ..fs.forks import ProcessLocal

__all__ = ["CacheCounter", "CacheStats"]

# Counted per process slot (the main process, then each worker), summed when read.
_SLOTS = 64


@dataclass(frozen=True)
class CacheStats:
    """Counts of a cache's work (all processes of one loader).

    Attributes:
        hits: byte ranges served from the cache.
        misses: byte ranges read from the store (then stored, unless ``bypassed``).
        bytes_from_cache: bytes served from the cache.
        bytes_from_store: bytes read from the store by cached reads (what a cache saves next
            time).
        bypassed: ranges read from the store and not stored: the cache was full of entries this
            run uses, or the disk too full.
        evicted: entries removed to make room (by this loader's processes).
        corrupt: entries that failed their check when read (removed, read from the store).
        write_errors: entries that could not be written (disk full, permissions): read on
            from the store, logged once per process.
        requests: calls to the store made by cached reads: range reads on a miss, and the
            identity check before a file's first download in a process. (A client may send
            more or fewer: pyarrow's S3 client asks for a file's size when it first opens it,
            and s3fs answers a check from the listing it holds.) 0 means nothing was asked.
    """

    hits: int = 0
    misses: int = 0
    bytes_from_cache: int = 0
    bytes_from_store: int = 0
    bypassed: int = 0
    evicted: int = 0
    corrupt: int = 0
    write_errors: int = 0
    requests: int = 0

    def __add__(self, other: CacheStats) -> CacheStats:
        return CacheStats(
            *(getattr(self, f.name) + getattr(other, f.name) for f in dataclasses.fields(self))
        )

    def __sub__(self, other: CacheStats) -> CacheStats:
        return CacheStats(
            *(getattr(self, f.name) - getattr(other, f.name) for f in dataclasses.fields(self))
        )

    @property
    def hit_rate(self) -> float:
        """Hits over all cached reads (0 when none)."""
        total = self.hits + self.misses
        return self.hits / total if total else 0.0


_FIELDS = tuple(f.name for f in dataclasses.fields(CacheStats))


class CacheCounter:
    """`CacheStats` in shared memory: a worker's counts are visible in the main process, with
    fork and spawn alike (as `fs.retry.RetryCounter`)."""

    def __init__(self) -> None:
        self._counts = torch.zeros((_SLOTS, len(_FIELDS)), dtype=torch.int64).share_memory_()  # type: ignore[no-untyped-call]
        self._lock: ProcessLocal[threading.Lock] = ProcessLocal(threading.Lock)

    def add(self, **counts: int) -> None:
        """Add ``counts`` (field name → amount) to this process's slot."""
        info = get_worker_info()
        slot = 0 if info is None else (info.id + 1) % _SLOTS
        with self._lock.get():
            row = self._counts[slot]
            for name, n in counts.items():
                row[_FIELDS.index(name)] += n

    def snapshot(self) -> CacheStats:
        """The counts so far, summed over processes."""
        return CacheStats(*(int(v) for v in self._counts.sum(dim=0).tolist()))

    def __getstate__(self) -> dict[str, object]:
        return {"counts": self._counts}

    def __setstate__(self, state: dict[str, object]) -> None:
        counts = state["counts"]
        assert isinstance(counts, torch.Tensor)
        self._counts = counts
        self._lock = ProcessLocal(threading.Lock)
