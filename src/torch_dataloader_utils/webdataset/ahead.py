"""Range reads started ahead of need, in a small thread pool of one format instance.

Remote shards wait on the network for every range request; starting the next one while the
current one is sliced and decoded hides that wait. The pool is built lazily, bounded
(`ReadsAhead.limit` reads pending), and dropped in a forked child, where its threads do not
exist (a read submitted there would never run).
"""

from __future__ import annotations

import os
from collections import OrderedDict
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor

__all__ = ["ReadsAhead"]

Key = tuple[str, int, int]  # (path, first byte, end)

# What forked children inherited from a parent (see `ReadsAhead.check_process`).
_inherited: list[object] = []


class ReadsAhead:
    """Reads of ``(path, first byte, end)`` started in background threads.

    Args:
        limit: reads pending at most (also the threads).
    """

    def __init__(self, limit: int = 2) -> None:
        self.limit = limit
        self._pending: OrderedDict[Key, Future[bytes]] = OrderedDict()
        self._pool: ThreadPoolExecutor | None = None
        self._pid = os.getpid()

    def check_process(self) -> None:
        """A forked child drops what it inherited: the parent's threads and pending reads.
        They stay referenced, never shut down here (they are the parent's)."""
        if self._pid != os.getpid():
            _inherited.append((self._pending, self._pool))
            self._pending, self._pool, self._pid = OrderedDict(), None, os.getpid()

    def start(self, key: Key, read: Callable[[str, int, int], bytes]) -> bool:
        """Start ``read(path, offset, size)`` of ``key`` unless it is started or `limit`
        reads are pending; whether it is pending now."""
        self.check_process()
        if key in self._pending:
            return True
        if len(self._pending) >= self.limit:
            return False
        if self._pool is None:
            self._pool = ThreadPoolExecutor(self.limit, thread_name_prefix="tdu-wds-fetch")
        path, first, end = key
        self._pending[key] = self._pool.submit(read, path, first, end - first)
        return True

    def take(self, key: Key) -> Future[bytes] | None:
        """The read of ``key`` if started (no longer pending here), else None."""
        self.check_process()
        return self._pending.pop(key, None)

    def drop(self, key: Key) -> None:
        """Forget the read of ``key`` (not needed after all)."""
        future = self.take(key)
        if future is not None:
            future.cancel()

    def close(self) -> None:
        """Drop every pending read and the threads, waiting for a request in flight (at most
        one read's time): a process forked while a thread is inside a storage client's request
        would inherit its locks held (measured: a forked DataLoader worker hung)."""
        self.check_process()
        for future in self._pending.values():
            future.cancel()
        self._pending.clear()
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None
