"""The training loop's exposed wait for each batch (`Waits`): the time from asking the loader
for a batch to having it, measured in the main process around the loader's iterator. The
loop's own work between batches is never counted."""

from __future__ import annotations

import time
from array import array
from collections.abc import Iterator
from typing import TypeVar

__all__ = ["Waits"]

_T = TypeVar("_T")


class Waits:
    """One pass's exposed waits: each batch's (seconds) and when it was handed out (seconds
    since the pass began), 12 bytes a batch. The first batch's wait includes the pass's start
    (``iter(loader)``: workers started) and the total the last call, which ends the pass
    (workers stopped): the loop waits through both."""

    def __init__(self, epoch: int = 0, started: float | None = None) -> None:
        self.epoch = epoch
        self.started = time.perf_counter() if started is None else started
        self.each = array("f")
        self.at = array("d")
        self.total = 0.0
        self.longest = 0.0

    @property
    def batches(self) -> int:
        """Batches handed out in the pass."""
        return len(self.each)

    def timed(self, batches: Iterator[_T]) -> Iterator[_T]:
        """``batches``, each one's wait recorded."""
        clock = time.perf_counter
        first = True
        while True:
            start = self.started if first else clock()
            first = False
            try:
                batch = next(batches)
            except StopIteration:
                self.total += clock() - start
                return
            end = clock()
            waited = end - start
            self.each.append(waited)
            self.at.append(end - self.started)
            self.total += waited
            self.longest = max(self.longest, waited)
            yield batch

    def elapsed(self) -> float:
        """Seconds since the pass began."""
        return time.perf_counter() - self.started
