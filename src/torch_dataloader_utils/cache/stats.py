"""What a cache did, counted over the main process and its DataLoader workers."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from ..fs.counts import SharedCounts

__all__ = ["CacheCounter", "CacheStats"]


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
            loader uses, or the disk too full.
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


_FIELDS = tuple(f.name for f in dataclasses.fields(CacheStats))


class CacheCounter(SharedCounts):
    """`CacheStats` counted over the main process and its workers (`fs.counts`)."""

    def __init__(self) -> None:
        super().__init__(len(_FIELDS))

    def add(self, **counts: int) -> None:  # type: ignore[override]
        """Add ``counts`` (field name → amount) to this process's counts."""
        super().add({_FIELDS.index(name): n for name, n in counts.items()})

    def snapshot(self) -> CacheStats:
        """The counts so far, summed over processes."""
        return CacheStats(*self.totals())
