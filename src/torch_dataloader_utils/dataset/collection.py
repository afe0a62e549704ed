"""Planning without Python's cyclic garbage collector (`paused_collection`).

Planning makes a few objects per file and row group (footer facts, tuples, chunks) and keeps
most of them: each pass of the collector walks them all again, and in a process that has
imported torch the collector's full passes walk a large heap. Planning 20,000 local files took
2.8-2.9 s with it and 2.1-2.2 s without (docs/benchmarks.md#planning-without-the-collector);
its reference cycles, if any, are collected once it is on again.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["paused_collection"]


@contextmanager
def paused_collection() -> Iterator[None]:
    """The cyclic collector off inside (a decorator too); on again after, if it was on."""
    was_on = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_on:
            gc.enable()
