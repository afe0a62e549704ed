"""Open files (and what reading a file needs) kept per process, safe across ``fork``.

DataLoader workers are often forked from a process that already read: a forked child must not
use the parent's open files (a local handle shares its file offset with the parent's, a remote
one its storage connections), nor close them (they are still the parent's). `HandleCache` keeps
its handles in a `fs.forks.ProcessLocal`: a forked child sets the inherited ones aside and opens
its own.
"""

from __future__ import annotations

import functools
from collections import OrderedDict
from collections.abc import Callable, Hashable
from typing import Generic, TypeVar

from ..fs.forks import ProcessLocal

__all__ = ["HandleCache"]

K = TypeVar("K", bound=Hashable)
H = TypeVar("H")


class HandleCache(Generic[K, H]):
    """The last ``capacity`` handles used, by key, in the process that opened them.

    Pickles through its arguments: a copy holds no handle.

    Args:
        capacity: handles kept; opening one more closes the least recently used.
        close: closes an evicted handle (or one dropped by `clear` or `forget`); ``None``:
            nothing to close (cached facts, not open files).
    """

    def __init__(self, capacity: int, close: Callable[[H], None] | None = None) -> None:
        self._capacity = capacity
        self._close = close
        self._handles: ProcessLocal[OrderedDict[K, H]] = ProcessLocal(OrderedDict)

    def get(self, key: K, open_fn: Callable[[], H]) -> H:
        """The handle of ``key``, opened with ``open_fn()`` unless this process holds it.

        Raises:
            Exception: what ``open_fn`` raises (nothing is kept then).
        """
        handles = self._handles.get()
        found = handles.get(key)
        if found is not None:
            handles.move_to_end(key)
            return found
        handle = open_fn()
        handles[key] = handle
        while len(handles) > self._capacity:
            _, old = handles.popitem(last=False)
            if self._close is not None:
                self._close(old)
        return handle

    def forget(self, key: K) -> None:
        """Close and forget the handle of ``key``, if this process holds one."""
        found = self._handles.get().pop(key, None)
        if found is not None and self._close is not None:
            self._close(found)

    def clear(self) -> None:
        """Close and forget this process's handles (a parent's, after a fork, stay open)."""
        handles = self._handles.pop()
        if handles is not None and self._close is not None:
            for handle in handles.values():
                self._close(handle)

    def __len__(self) -> int:
        return len(self._handles.peek() or ())

    def __reduce__(self) -> tuple[Callable[[], HandleCache[K, H]], tuple[()]]:
        return (functools.partial(type(self), self._capacity, self._close), ())
