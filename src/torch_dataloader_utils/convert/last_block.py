"""What the converter derives from a block once, for every batch cut from it (`LastBlock`)."""

from __future__ import annotations

import weakref
from typing import Any, Generic, TypeVar

__all__ = ["LastBlock"]

T = TypeVar("T")


class LastBlock(Generic[T]):
    """A value made from the block converted last, kept while that block is the one converted.

    Small batches are cut from one shuffle block thousands of times: its columns' wrappers, its
    parts and its stacks are made once. The block is held by a weak reference, so the value
    never keeps it alive.
    """

    __slots__ = ("_last",)

    def __init__(self) -> None:
        self._last: tuple[weakref.ref[Any], T] | None = None

    def get(self, block: Any) -> T | None:
        """The value kept for ``block``, or None when it is not the block seen last."""
        last = self._last
        return last[1] if last is not None and last[0]() is block else None

    def keep(self, block: Any, value: T) -> T:
        """Keep ``value`` for ``block`` (forgetting the previous block's); returns it."""
        self._last = (weakref.ref(block), value)
        return value
