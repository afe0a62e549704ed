"""The main-process side: messages unpacked into batches (`Unbundler`) and put back in
DataLoader's order (`in_order`).
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Iterator
from typing import Any

from ..errors import DataError
from ..errors.on_error import ReadFailure, log_failure
from ..metrics.clock import UNPACK, StageClock
from ..planning import delivery_order
from .ipc import ArrowBundle
from .wire import Bundle, PackedBundle

__all__ = ["Unbundler", "in_order"]


class Unbundler:
    """Unpacks the messages of a TabularDataLoader's workers into batches.

    Args:
        finish: applied to each batch unpacked from a `PackedBundle` (the worker could not
            finish those: nested tensors are built after the hop).
        failures: where the reads the workers skipped (``on_error="skip"``) are collected.
        clock: where the time unpacking is counted (`metrics.clock`).
    """

    def __init__(
        self,
        finish: Callable[[dict[str, Any]], dict[str, Any]] | None = None,
        failures: list[ReadFailure] | None = None,
        clock: StageClock | None = None,
    ) -> None:
        self.finish = finish
        self.failures = failures
        self.clock = clock

    def __call__(self, item: Any) -> Iterator[Any] | list[Any]:
        """The batches of one message (anything but a bundle is one batch), the time taken
        counted in the clock's ``unpack``: a `PackedBundle`'s made one at a time, as they are
        asked for (`PackedBundle.each`)."""
        if self.failures is not None and isinstance(item, PackedBundle | ArrowBundle | Bundle):
            for failure in item.failures:
                log_failure(failure)
                self.failures.append(failure)
        if isinstance(item, PackedBundle):
            return self._each(item)
        start = time.perf_counter()
        try:
            return item.unpack() if isinstance(item, ArrowBundle | Bundle) else [item]
        finally:
            if self.clock is not None:
                self.clock.add(UNPACK, time.perf_counter() - start)

    def _each(self, bundle: PackedBundle) -> Iterator[Any]:
        clock, finish = self.clock, self.finish
        batches = bundle.each()
        while True:
            start = time.perf_counter()
            batch = next(batches, None)  # (a batch is a dict, never None)
            if batch is None:
                return
            if finish is not None:
                batch = finish(batch)
            if clock is not None:
                clock.add(UNPACK, time.perf_counter() - start)
            yield batch


def in_order(
    messages: Iterator[Any], counts: list[int], done: list[int], unpack: Unbundler
) -> Iterator[Any]:
    """The batches of the workers' ``messages`` in DataLoader's order: one per worker in turn.

    ``counts``: batches of each worker's stream; ``done``: how many each delivered before this
    pass (`planning.delivery_order` continues from there). A worker that ends early or a batch
    too many is an error: the rank would otherwise deliver other batches than planned.
    """
    # Each worker's messages' batches, made as they are taken (`Unbundler`).
    queues: list[deque[Iterator[Any]]] = [deque() for _ in counts]
    for worker in delivery_order(counts, done):
        queue = queues[worker]
        batch = _END
        while batch is _END:
            while not queue:
                message = next(messages, _END)
                if message is _END:
                    raise DataError(
                        f"worker {worker} ended before its {counts[worker]} planned "
                        "batches: a batch it sent was lost (see the worker's output above "
                        "for an error while sending it), or the data changed while it "
                        "was read"
                    )
                sender = getattr(message, "worker", -1)
                if not 0 <= sender < len(queues):
                    raise RuntimeError(
                        "a worker message without its worker id: is the dataset a "
                        "StructuredDataset iterated by its own TabularDataLoader?"
                    )
                queues[sender].append(iter(unpack(message)))
            batch = next(queue[0], _END)
            if batch is _END:
                queue.popleft()
        yield batch
    left = any(next(batches, _END) is not _END for queue in queues for batches in queue)
    if left or next(messages, _END) is not _END:
        raise DataError("workers delivered more batches than planned")


_END = object()
