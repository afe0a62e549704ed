"""A background thread that reads ahead of the consumer, bounded in items."""

from __future__ import annotations

import queue
import threading
from collections.abc import Iterable, Iterator
from typing import Generic, TypeVar

__all__ = ["Prefetcher"]

T = TypeVar("T")

_DONE = object()
_POLL_SECONDS = 0.1


class Prefetcher(Generic[T]):
    """Iterate ``source`` in a daemon thread, ``depth`` items ahead of the consumer.

    pyarrow releases the GIL while it reads and decodes, so the thread overlaps I/O and decoding
    with the consumer's shuffling and conversion. An exception in the thread is re-raised in the
    consumer at the point where the failed item would have arrived. Closing the iterator (or
    dropping it) stops the thread.
    """

    def __init__(self, source: Iterable[T], depth: int = 2, name: str = "tdu-prefetch") -> None:
        self._queue: queue.Queue[object] = queue.Queue(maxsize=max(1, depth))
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

    def _run(self, source: Iterable[T]) -> None:
        try:
            for item in source:
                if not self._put(item):
                    return
        except BaseException as exc:  # re-raised in the consumer, never swallowed
            self._put(_Failure(exc))
            return
        self._put(_DONE)

    def __iter__(self) -> Iterator[T]:
        if self._thread.ident is None:  # not started yet
            self._thread.start()
        try:
            while True:
                item = self._queue.get()
                if item is _DONE:
                    return
                if isinstance(item, _Failure):
                    raise item.exc
                yield item  # type: ignore[misc]
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
