"""A background thread that reads ahead of the consumer, bounded in items."""

from __future__ import annotations

import atexit
import queue
import threading
import time
import weakref
from collections.abc import Iterable, Iterator
from typing import Any, Generic, TypeVar

__all__ = ["Prefetcher"]

T = TypeVar("T")

_DONE = object()
_POLL_SECONDS = 0.1
# At interpreter exit, how long the threads still running get to finish the item they make.
_EXIT_SECONDS = 30.0
_running: weakref.WeakSet[Prefetcher[Any]] = weakref.WeakSet()


@atexit.register
def _stop_running() -> None:
    """Stop the threads of iterators left unfinished when the program ends (a loop left with
    ``break``, then the script ends). Once Python is finalizing, a daemon thread that comes back
    from pyarrow's native code (which released the GIL) is ended inside it, and the C++ runtime
    aborts the process ("terminate called without an active exception", exit status 134;
    docs/adr/0020-measurements-behind-constants.md#the-prefetch-thread). atexit runs before
    that."""
    running = list(_running)
    for prefetcher in running:
        prefetcher._stop.set()
    deadline = time.monotonic() + _EXIT_SECONDS
    for prefetcher in running:
        prefetcher._thread.join(max(0.0, deadline - time.monotonic()))


class Prefetcher(Generic[T]):
    """Iterate ``source`` in a daemon thread, ``depth`` items ahead of the consumer.

    pyarrow releases the GIL while it reads and decodes, so the thread overlaps I/O and decoding
    with the consumer's shuffling and conversion. An exception in the thread is re-raised in the
    consumer at the point where the failed item would have arrived. Closing the iterator (or
    dropping it) stops the thread.

    Memory: at most ``depth`` items exist ahead of the one the consumer took last, counting the
    one being made: the thread starts on an item only once the consumer has taken an earlier
    one. (A thread that made the next item while ``depth`` waited in the queue held one item
    more: docs/adr/0020-measurements-behind-constants.md#the-prefetch-thread.)
    """

    def __init__(
        self,
        source: Iterable[T],
        depth: int = 2,
        name: str = "tdu-prefetch",
        *,
        thread: bool = True,
    ) -> None:
        # ``thread=False``: ``source`` is iterated in the consumer's thread, nothing ahead (a
        # worker whose machine has no core left for the thread: `stream.pipeline`).
        self._source = None if thread else source
        self._queue: queue.Queue[object] = queue.Queue(maxsize=max(1, depth))
        # A permit per item the thread may make before the consumer takes one.
        self._room = threading.Semaphore(max(1, depth))
        self._stop = threading.Event()
        # Started by __iter__: a Prefetcher that is never iterated holds no thread.
        self._thread = threading.Thread(target=self._run, args=(source,), name=name, daemon=True)

    def _put(self, item: object) -> bool:
        while not self._stop.is_set():
            try:
                self._queue.put(item, timeout=_POLL_SECONDS)
                return True
            except queue.Full:
                continue
        return False

    def _wait_for_room(self) -> bool:
        while not self._stop.is_set():
            if self._room.acquire(timeout=_POLL_SECONDS):
                return True
        return False

    def _run(self, source: Iterable[T]) -> None:
        try:
            items = iter(source)
            while self._wait_for_room():
                item = next(items, _DONE)
                if not self._put(item) or item is _DONE:
                    return
                del item  # the thread holds nothing while it waits for room
        except BaseException as exc:  # re-raised in the consumer, never swallowed
            self._put(_Failure(exc))

    def __iter__(self) -> Iterator[T]:
        if self._source is not None:  # read in turn
            yield from self._source
            return
        if self._thread.ident is None:  # not started yet
            _running.add(self)
            self._thread.start()
        try:
            held: list[T] = []
            while True:
                item = self._queue.get()
                self._room.release()  # the thread may make the next one
                if item is _DONE:
                    return
                if isinstance(item, _Failure):
                    raise item.exc
                held.append(item)  # type: ignore[arg-type]
                del item
                # Not kept alive while it is consumed: a block permuted whole lets its
                # source go (`stream.blocks.permuted_whole`).
                yield held.pop()
        finally:
            self.close()

    def close(self) -> None:
        """Stop the thread and wait for it."""
        self._stop.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join()


class _Failure:
    __slots__ = ("exc",)

    def __init__(self, exc: BaseException) -> None:
        self.exc = exc
