"""Fork safety, in one place: values that belong to the process that built them.

DataLoader workers are often forked from a process that already read. A forked child inherits
a copy of everything its parent held, and much of it does not work there (each seen in
practice):

- clients and connections: a native S3 client's pooled connection gave "Weird server reply" in
  a forked worker; the Azure C++ SDK's process-wide connection pool mixed up the responses of
  parent and child (`fs/spec.py`);
- thread pools: the parent's threads do not exist in the child, so a read submitted to them
  never runs, and a read the parent had pending never completes;
- open files: a local handle shares its file offset with the parent's;
- locks: one that a parent's thread held at the fork stays held in the child for ever.

Nor may a child close, flush or join what it inherited: those objects are still its parent's
(finalizing an s3fs client in a child closes its aiohttp session on a loop that is not the
child's: "attached to a different loop" tracebacks in every worker).

One mechanism handles all of it. `ProcessLocal` holds a value built on first use in each
process. ``os.register_at_fork`` (as fsspec does) runs `_after_fork_in_child` in every forked
child, before any other code there: each holder sets its parent's value aside, referenced until
the child exits and never closed (`keep_inherited`), and the child builds its own on first use.
A holder pickles as how to build its value, never the value, so a spawned process builds its
own too. A class that keeps anything per process keeps it in a `ProcessLocal` and needs no
check of its own.
"""

from __future__ import annotations

import os
import threading
import weakref
from collections.abc import Callable
from typing import Any, Generic, TypeVar

__all__ = ["ProcessLocal", "keep_inherited"]

T = TypeVar("T")

# What forked children inherited from their parents: referenced until the child exits, so that
# no finalizer closes (or flushes, or joins) a parent's object from the child.
_inherited: list[object] = []
# Every live holder, for the after-fork hook.
_holders: weakref.WeakSet[ProcessLocal[Any]] = weakref.WeakSet()
_UNBUILT: Any = object()


def keep_inherited(*objects: object) -> None:
    """Keep ``objects`` (a forked child's inheritance from its parent) referenced, unclosed."""
    _inherited.append(objects)


def _after_fork_in_child() -> None:
    # The child runs one thread here, before anything else: no holder is in use.
    for holder in list(_holders):
        holder._forked()


os.register_at_fork(after_in_child=_after_fork_in_child)


class ProcessLocal(Generic[T]):
    """A value of the process that uses it, built on first use by ``make()``.

    In a forked child the parent's value is set aside (`keep_inherited`: referenced, never
    closed) and the child builds its own on first use. Pickling (or copying) a holder gives a
    holder of no value yet, which builds its own.

    Args:
        make: builds the value; pickled with the holder (a class or a module-level function,
            where the holder is pickled).

    Attributes:
        inherited: whether an ancestor process built a value before forking this one (e.g.
            the Azure SDK's process-wide pool, which a child must not build again).
    """

    def __init__(self, make: Callable[[], T]) -> None:
        self._make = make
        self._value: T = _UNBUILT
        self._lock = threading.Lock()
        self.inherited = False
        _holders.add(self)

    def _forked(self) -> None:
        if self._value is not _UNBUILT:
            keep_inherited(self._value)
            self.inherited = True
        self._value = _UNBUILT
        self._lock = threading.Lock()  # the parent's may have been held at the fork

    def get(self) -> T:
        """This process's value, built now if it has none (once, whatever the threads)."""
        value = self._value
        if value is _UNBUILT:
            with self._lock:
                value = self._value
                if value is _UNBUILT:
                    value = self._value = self._make()
        return value

    def peek(self) -> T | None:
        """This process's value, or ``None`` if it has none (nothing is built)."""
        value = self._value
        return None if value is _UNBUILT else value

    def pop(self) -> T | None:
        """This process's value, forgotten here (closing it is the caller's), or ``None``."""
        with self._lock:
            value, self._value = self._value, _UNBUILT
        return None if value is _UNBUILT else value

    def __reduce__(self) -> tuple[type[ProcessLocal[T]], tuple[Callable[[], T]]]:
        return (type(self), (self._make,))

    def __repr__(self) -> str:
        state = "unbuilt" if self._value is _UNBUILT else "built"
        return f"ProcessLocal({getattr(self._make, '__qualname__', self._make)!r}, {state})"
