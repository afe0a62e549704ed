"""Byte ranges of remote objects: fetched in parallel parts, started ahead of need, and read
back as a file.

A Parquet reader asks for one column chunk at a time; on object storage each ask is a request
with tens of milliseconds of latency, and through an fsspec file object the asks are serialised
(docs/adr/0006-object-storage-reads.md). Formats that know their byte ranges in advance (from a
footer or an index) fetch them here instead: close ranges are coalesced, large ones split into
parts, and the parts requested in parallel threads (`RangeFetcher`), ahead of decoding
(`ReadsAhead`). Decoding then reads from memory through a `RangeFile`.

Both keep their threads and pending reads per process (`fs.forks`): a forked DataLoader worker
starts its own, and never waits on its parent's.
"""

from __future__ import annotations

import bisect
import functools
import io
import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable, Iterator, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, TypeVar

import pyarrow as pa

from . import threads
from .forks import ProcessLocal

__all__ = ["RangeFetcher", "RangeFile", "ReadsAhead", "coalesce"]

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")

# Ranges closer than this are fetched as one (the gap is read and discarded): a request costs
# more than reading a megabyte on any object store.
HOLE_BYTES = 1 << 20
# Parts of a large range are fetched in parallel (`threads.FETCH_THREADS` at once);
# per-request throughput on object stores is limited, concurrency is not.
PART_BYTES = 8 << 20


def coalesce(ranges: Sequence[tuple[int, int]], hole: int = HOLE_BYTES) -> list[tuple[int, int]]:
    """Merge ``(offset, size)`` ranges whose gaps are at most ``hole`` bytes; sorted."""
    merged: list[tuple[int, int]] = []
    for offset, size in sorted(r for r in ranges if r[1] > 0):
        if merged and offset <= merged[-1][0] + merged[-1][1] + hole:
            start = merged[-1][0]
            merged[-1] = (start, max(merged[-1][1], offset + size - start))
        else:
            merged.append((offset, size))
    return merged


class RangeFile(io.RawIOBase):
    """A read-only file of ``size`` bytes of which some ranges are in memory.

    A read inside a fetched range is a zero-copy slice; any other read is fetched on demand
    with ``fetch(offset, size)`` (correct, only slower). With ``ahead``, such a fetch is of at
    least ``ahead`` bytes, kept for the reads that follow (as fsspec's files read ahead: a
    reader of many small ranges, such as ORC's, then makes a few requests, not hundreds).
    Wrap it in ``pyarrow.PythonFile``.
    """

    def __init__(
        self,
        size: int,
        ranges: dict[int, bytes | bytearray],
        fetch: Callable[[int, int], bytes],
        *,
        ahead: int = 0,
    ) -> None:
        super().__init__()
        self._size = size
        self._starts = sorted(ranges)
        self._data = [memoryview(ranges[s]) for s in self._starts]
        self._fetch = fetch
        self._pos = 0
        self._ahead = ahead
        self._block: tuple[int, memoryview] = (0, memoryview(b""))  # the last fetch ahead

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._pos, io.SEEK_END: self._size}[whence]
        self._pos = max(0, base + offset)
        return self._pos

    def read(self, size: int = -1) -> bytes | memoryview:
        pos = self._pos
        stop = self._size if size is None or size < 0 else min(self._size, pos + size)
        if stop <= pos:
            return b""
        self._pos = stop
        i = bisect.bisect_right(self._starts, pos) - 1
        if i >= 0:
            start, data = self._starts[i], self._data[i]
            if stop <= start + len(data):
                return data[pos - start : stop - start]
        if not self._ahead:
            return self._fetch(pos, stop - pos)
        start, block = self._block
        if not (start <= pos and stop <= start + len(block)):
            end = min(self._size, max(stop, pos + self._ahead))
            start, block = pos, memoryview(self._fetch(pos, end - pos))
            self._block = (start, block)
        return block[pos - start : stop - start]

    def readinto(self, buffer: memoryview) -> int:  # type: ignore[override]
        data = self.read(len(buffer))
        buffer[: len(data)] = data
        return len(data)

    def arrow(self) -> pa.PythonFile:
        """This file as a pyarrow input file."""
        return pa.PythonFile(self, mode="r")


def _fetch_pool() -> ThreadPoolExecutor:
    return ThreadPoolExecutor(threads.FETCH_THREADS, thread_name_prefix="tdu-fetch")


class RangeFetcher:
    """Fetches byte ranges with a pool of threads, built lazily in each process.

    Args:
        read: ``read(path, offset, size) -> bytes``, one request (retried by the caller's
            policy); called from several threads at once.
    """

    def __init__(self, read: Callable[[str, int, int], bytes]) -> None:
        self._read = read
        self._pool: ProcessLocal[ThreadPoolExecutor] = ProcessLocal(_fetch_pool)

    def fetch(
        self, path: str, ranges: Sequence[tuple[int, int]]
    ) -> Future[dict[int, bytes | bytearray]]:
        """Start fetching ``ranges`` (coalesced and split into parts, in parallel).

        Returns:
            A future of ``{offset: bytes}`` per coalesced range; it raises what a part's
            request raised.
        """
        pool = self._pool.get()
        merged = coalesce(ranges)
        parts: list[tuple[int, int, int, Future[bytes]]] = []
        for index, (offset, size) in enumerate(merged):
            for lo in range(offset, offset + size, PART_BYTES):
                n = min(PART_BYTES, offset + size - lo)
                parts.append((index, lo, n, pool.submit(self._read, path, lo, n)))
        result: Future[dict[int, bytes | bytearray]] = Future()
        if not parts:
            result.set_result({})
            return result
        remaining = [len(parts)]
        lock = threading.Lock()

        def assemble(done: Future[bytes]) -> None:
            del done
            with lock:  # parts finish in different threads
                remaining[0] -= 1
                if remaining[0]:
                    return
            try:
                buffers: dict[int, bytes | bytearray] = {}
                for index, (offset, size) in enumerate(merged):
                    mine = [p for p in parts if p[0] == index]
                    if len(mine) == 1:
                        buffers[offset] = mine[0][3].result()
                        continue
                    whole = bytearray(size)
                    for _, lo, n, future in mine:
                        whole[lo - offset : lo - offset + n] = future.result()
                    buffers[offset] = whole
                outcome: tuple[dict[int, bytes | bytearray] | None, BaseException | None] = (
                    buffers,
                    None,
                )
            except BaseException as exc:  # the first failed part's error, in the consumer
                outcome = (None, exc)
            if not result.set_running_or_notify_cancel():
                return  # cancelled: nobody wants these bytes
            if outcome[1] is not None:
                result.set_exception(outcome[1])
            else:
                assert outcome[0] is not None
                result.set_result(outcome[0])

        for part in parts:
            part[3].add_done_callback(assemble)
        return result

    def close(self) -> None:
        """Stop this process's threads (pending fetches are cancelled)."""
        pool = self._pool.pop()
        if pool is not None:
            pool.shutdown(wait=False, cancel_futures=True)


class ReadsAhead(Mapping[K, "Future[V]"]):
    """Reads started ahead of need, by key, until their reader takes them.

    On object storage every read waits on the network; starting the next one while the current
    one is decoded hides that wait. A read is begun by `start` (with whatever makes a future:
    a `RangeFetcher`'s parallel parts) or `submit` (on threads of its own, `limit` of them,
    made on first use). At most `limit` reads are pending: one more is not started, and none
    pending is dropped to make room (a cancelled read would be made twice).

    As a mapping: the reads pending in this process, by key. Pending reads and threads are
    this process's (`fs.forks`): a forked child sees none of its parent's, whose threads do
    not exist in it, and never cancels or joins them. Pickles through its arguments.

    Args:
        limit: reads pending at most (and the threads of `submit`).
        name: the names of `submit`'s threads.
    """

    def __init__(self, limit: int = threads.AHEAD_THREADS, *, name: str = "tdu-ahead") -> None:
        self.limit = limit
        self.name = name
        self._pending: ProcessLocal[OrderedDict[K, Future[V]]] = ProcessLocal(OrderedDict)
        self._pool: ProcessLocal[ThreadPoolExecutor] = ProcessLocal(
            functools.partial(ThreadPoolExecutor, limit, thread_name_prefix=name)
        )

    def start(self, key: K, begin: Callable[[], Future[V] | None]) -> bool:
        """Begin the read of ``key`` with ``begin()`` unless it is pending or `limit` reads
        are; ``begin`` may return ``None`` (not worth reading ahead). Whether it is pending."""
        pending = self._pending.get()
        if key in pending:
            return True
        if len(pending) >= self.limit:
            return False
        future = begin()
        if future is None:
            return False
        pending[key] = future
        return True

    def submit(self, key: K, read: Callable[..., V], *args: Any) -> bool:
        """`start` ``read(*args)`` on this object's own threads."""
        return self.start(key, lambda: self._pool.get().submit(read, *args))

    def take(self, key: K) -> Future[V] | None:
        """The read of ``key`` if pending (handed over: no longer pending here), else None."""
        return self._pending.get().pop(key, None)

    def drop(self, key: K) -> None:
        """Forget the read of ``key`` (not needed after all)."""
        future = self.take(key)
        if future is not None:
            future.cancel()

    def close(self) -> None:
        """Drop every pending read, and stop the own threads, waiting for a request in flight
        (at most one read's time): a process forked while a thread is inside a storage
        client's request inherits the client's locks held, and hangs
        (docs/adr/0020-measurements-behind-constants.md#forked-processes)."""
        pending = self._pending.get()
        for future in pending.values():
            future.cancel()
        pending.clear()
        pool = self._pool.pop()
        if pool is not None:
            pool.shutdown(wait=True, cancel_futures=True)

    def __getitem__(self, key: K) -> Future[V]:
        return self._pending.get()[key]

    def __contains__(self, key: object) -> bool:
        return key in self._pending.get()

    def __iter__(self) -> Iterator[K]:
        return iter(self._pending.get())

    def __len__(self) -> int:
        return len(self._pending.get())

    def __reduce__(self) -> tuple[Callable[[], ReadsAhead[K, V]], tuple[()]]:
        return (functools.partial(type(self), self.limit, name=self.name), ())
