"""Batches onto the training device (`create_dataloader(device=...)`).

On CUDA each batch's copy is issued on a side stream ``ahead`` batches before it is handed out,
so it runs while the training step of the batch before it runs on the current stream; with
``pin_memory=True`` the copy is a DMA that takes no CPU. The step's stream waits on the copy's
event, and each copied tensor is recorded on that stream, so the caching allocator does not
hand its memory out again before the step's kernels are done with it. On another device the
copy (``non_blocking``) is issued as far ahead, in the device's own queue.
"""

from __future__ import annotations

import collections
from collections.abc import Callable, Iterator
from typing import Any

import torch

from .wire import map_tensors

__all__ = ["ahead", "to_device"]

# One batch ahead overlaps a copy with a step; more only holds more device memory (a step is
# longer than its batch's copy at any PCIe or NVLink rate a loader feeds).
AHEAD = 1


def to_device(batches: Iterator[Any], device: torch.device, depth: int = AHEAD) -> Iterator[Any]:
    """``batches`` with their tensors on ``device``."""
    if device.type == "cuda":
        return ahead(batches, _SideStream(device).copy, depth)

    def copy(batch: Any) -> Callable[[], Any]:
        moved = map_tensors(batch, lambda t: t.to(device, non_blocking=True))
        return lambda: moved

    return ahead(batches, copy, depth)


def ahead(
    batches: Iterator[Any], copy: Callable[[Any], Callable[[], Any]], depth: int
) -> Iterator[Any]:
    """``batches`` with each one's ``copy`` started ``depth`` batches before it is handed out.

    ``copy(batch)`` starts a copy and returns what finishes it (waits for it, gives the copy).
    """
    pending: collections.deque[Callable[[], Any]] = collections.deque()
    for batch in batches:
        pending.append(copy(batch))
        if len(pending) > depth:
            yield pending.popleft()()
    while pending:
        yield pending.popleft()()


class _SideStream:
    """Copies to a CUDA device on a stream of their own."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.stream = torch.cuda.Stream(device)  # type: ignore[no-untyped-call]

    def copy(self, batch: Any) -> Callable[[], Any]:
        # The host tensors may be dropped once copied: a pinned one's memory is held by torch's
        # host allocator until the copy is done, and a pageable one is staged before the call
        # returns.
        with torch.cuda.stream(self.stream):
            moved = map_tensors(batch, lambda t: t.to(self.device, non_blocking=True))
            done = torch.cuda.Event()  # type: ignore[no-untyped-call]
            done.record(self.stream)

        def finish() -> Any:
            current = torch.cuda.current_stream(self.device)
            current.wait_event(done)
            map_tensors(moved, lambda t: _used_on(t, current))
            return moved

        return finish


def _used_on(tensor: torch.Tensor, stream: torch.cuda.Stream) -> torch.Tensor:
    if tensor.is_cuda:
        tensor.record_stream(stream)
    return tensor
