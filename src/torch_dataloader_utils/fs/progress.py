"""Progress of a long planning step, logged at INFO now and then.

Planning a million files on object storage takes tens of minutes on rank 0 while the other ranks
wait (`sources.broadcast`): its log says how far it got and how fast it goes. A step that ends
within `LOG_EVERY` seconds logs nothing.
"""

from __future__ import annotations

import logging
import threading
import time

__all__ = ["LOG_EVERY", "Progress"]

logger = logging.getLogger("torch_dataloader_utils.planning")

# Seconds between two progress lines (and before the first).
LOG_EVERY = 5.0


class Progress:
    """Counts the items a step has done (from any thread) and logs ``done / total`` and the
    rate at most every `LOG_EVERY` seconds.

    Args:
        what: what is counted, for the log (``"Parquet footers read"``).
        total: how many there are.
        every: seconds between lines (`LOG_EVERY` by default).
    """

    def __init__(self, what: str, total: int, *, every: float | None = None) -> None:
        self.what = what
        self.total = total
        self.every = LOG_EVERY if every is None else every
        self.done = 0
        self._lock = threading.Lock()
        self._start = self._last = time.monotonic()
        self._logged = False

    def add(self, n: int = 1) -> None:
        """``n`` more done; log if `every` seconds passed since the last line."""
        with self._lock:
            self.done += n
            now = time.monotonic()
            if now - self._last < self.every:
                return
            self._last = now
            self._logged = True
            done, elapsed = self.done, max(now - self._start, 1e-9)
        left = (self.total - done) * elapsed / max(done, 1)
        logger.info(
            "planning: %d of %d %s (%.0f%%) in %.0f s, %.0f a second, about %.0f s left",
            done,
            self.total,
            self.what,
            100 * done / max(self.total, 1),
            elapsed,
            done / elapsed,
            left,
        )

    @property
    def elapsed(self) -> float:
        """Seconds since the step started."""
        return time.monotonic() - self._start

    def finish(self) -> None:
        """Log the totals, when progress was logged."""
        if self._logged:
            elapsed = time.monotonic() - self._start
            logger.info(
                "planning: %d %s in %.1f s, %.0f a second",
                self.done,
                self.what,
                elapsed,
                self.done / max(elapsed, 1e-9),
            )
