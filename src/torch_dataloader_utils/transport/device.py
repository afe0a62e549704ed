"""Batches onto the training device (`create_dataloader(device=...)`).

Each batch's copy (``non_blocking``; with ``pin_memory=True`` a DMA that takes no CPU) is
issued ``ahead`` batches before it is handed out. On CUDA a batch of `SIDE_STREAM_BYTES` or
more is copied on a side stream, so the copy runs while the step of the batch before it runs
on the current stream: the step's stream waits on the copy's event, and each copied tensor is
recorded on that stream, so the caching allocator does not hand its memory out again before
the step's kernels are done with it. A smaller batch is copied on the step's own stream, in
order before the step that uses it (docs/adr/0038-small-batches-on-the-step-s-stream.md). On
another device the copy is issued as far ahead, in the device's own queue.
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
# Below this a batch's copy on the step's stream (under 0.1 ms at the 55 GB/s an H200 host
# copied) costs the GPU less than a side stream's events and stream switches cost the main
# thread a batch (0.10-0.19 ms there): docs/adr/0038-small-batches-on-the-step-s-stream.md.
SIDE_STREAM_BYTES = 4 << 20


def to_device(batches: Iterator[Any], device: torch.device, depth: int = AHEAD) -> Iterator[Any]:
    """``batches`` with their tensors on ``device``."""
    if device.type == "cuda":
        side = _SideStream(device)

        def on_cuda(batch: Any) -> Callable[[], Any]:
            if batch_nbytes(batch) >= SIDE_STREAM_BYTES:
                return side.copy(batch)
            return _on_current_stream(batch, device)

        return ahead(batches, on_cuda, depth)

    def copy(batch: Any) -> Callable[[], Any]:
        moved = map_tensors(batch, lambda t: t.to(device, non_blocking=True))
        return lambda: moved

    return ahead(batches, copy, depth)


def batch_nbytes(batch: Any) -> int:
    """The bytes of every tensor in ``batch``."""
    total = 0

    def count(tensor: torch.Tensor) -> torch.Tensor:
        nonlocal total
        total += tensor.nbytes
        return tensor

    map_tensors(batch, count)
    return total


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


def _on_current_stream(batch: Any, device: torch.device) -> Callable[[], Any]:
    """Copy ``batch`` on the current stream; what hands it out (on the stream current then)."""
    stream = torch.cuda.current_stream(device)
    moved = map_tensors(batch, lambda t: t.to(device, non_blocking=True))

    def finish() -> Any:
        current = torch.cuda.current_stream(device)
        if current != stream:  # the loop changed streams since: as a side stream's copy
            current.wait_stream(stream)
            map_tensors(moved, lambda t: _used_on(t, current))
        return moved

    return finish


def _used_on(tensor: torch.Tensor, stream: torch.cuda.Stream) -> torch.Tensor:
    if tensor.is_cuda:
        tensor.record_stream(stream)
    return tensor
