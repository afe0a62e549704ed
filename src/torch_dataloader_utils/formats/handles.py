"""Open files (and what reading a file needs) kept per process, safe across ``fork``.

DataLoader workers are often forked from a process that already read: a forked child must not
use the parent's open files (a local handle shares its file offset with the parent's, a remote
one its storage connections), nor close them (they are still the parent's). `HandleCache`
notices the fork on its next use, sets the inherited handles aside, and opens its own.
"""

from __future__ import annotations

import os
from collections import OrderedDict
from collections.abc import Callable, Hashable
from typing import Generic, TypeVar

__all__ = ["HandleCache", "keep_inherited"]

K = TypeVar("K", bound=Hashable)
H = TypeVar("H")

# What forked children inherited from their parent: referenced until the child exits, so that
# no finalizer closes (or flushes, or joins) a parent's object from the child.
_inherited: list[object] = []


def keep_inherited(*objects: object) -> None:
    """Keep ``objects`` (a forked child's inheritance from its parent) referenced, unclosed."""
    _inherited.append(objects)


class HandleCache(Generic[K, H]):
    """The last ``capacity`` handles used, by key, in the process that opened them.

    Args:
        capacity: handles kept; opening one more closes the least recently used.
        close: closes an evicted handle (or one dropped by `clear`); ``None``: nothing to close
            (cached facts, not open files).
    """

    def __init__(self, capacity: int, close: Callable[[H], None] | None = None) -> None:
        self._capacity = capacity
        self._close = close
        self._handles: OrderedDict[K, H] = OrderedDict()
        self._pid = os.getpid()

    def _check_process(self) -> None:
        if self._pid != os.getpid():  # forked: the handles are the parent's
            keep_inherited(self._handles)
            self._handles = OrderedDict()
            self._pid = os.getpid()

    def get(self, key: K, open_fn: Callable[[], H]) -> H:
        """The handle of ``key``, opened with ``open_fn()`` unless this process holds it.

        Raises:
            Exception: what ``open_fn`` raises (nothing is kept then).
        """
        self._check_process()
        found = self._handles.get(key)
        if found is not None:
            self._handles.move_to_end(key)
            return found
        handle = open_fn()
        self._handles[key] = handle
        while len(self._handles) > self._capacity:
            _, old = self._handles.popitem(last=False)
            if self._close is not None:
                self._close(old)
        return handle

    def clear(self) -> None:
        """Close and forget this process's handles (a parent's, after a fork, stay open)."""
        self._check_process()
        handles = list(self._handles.values())
        self._handles.clear()
        if self._close is not None:
            for handle in handles:
                self._close(handle)

    def __len__(self) -> int:
        self._check_process()
        return len(self._handles)
