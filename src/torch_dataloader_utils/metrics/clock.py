"""The seconds each process of a rank spends in each stage of a batch's life, in shared memory
(`StageClock`): a worker's are visible in the main process without a message, with fork and
spawn alike (the tensor travels with the pickled dataset; torch maps a spawned worker to the
same memory).

The stages, in a batch's order (each process records those it runs):

- ``read``: waiting for the next rows (fetching, decoding, assembling a shuffled block: the
  part the reading thread did not hide);
- ``make``: making the batch from them (gathering rows, converting, packing, collating) and,
  in a worker, putting it in shared memory;
- ``queue``: the main process waiting for a worker's message (its crossing included);
- ``unpack``: the main process taking the batches out of a message;
- ``device``: copying to the device (the host's part of it).
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from typing import TypeVar

import numpy as np
import torch
from torch.utils.data import get_worker_info

__all__ = ["BATCHES", "DEVICE", "MAKE", "QUEUE", "READ", "STAGES", "UNPACK", "StageClock"]

STAGES = ("read", "make", "queue", "unpack", "device")
READ, MAKE, QUEUE, UNPACK, DEVICE = range(len(STAGES))
BATCHES = len(STAGES)  # the column counting the batches a process made
# One row per process of a rank (main process 0, worker w at w + 1), so processes never write
# the same memory; one thread of each records.
_SLOTS = 257

_T = TypeVar("_T")


class StageClock:
    """Nanoseconds in each of `STAGES` and batches made, per process of a rank.

    A record is a numpy add into shared memory (~1 µs): cheap enough per batch to stay on
    (`SharedCounts`' lock and tensor ops cost ~10 times more; docs/benchmarks.md#metrics).
    """

    def __init__(self) -> None:
        self._tensor = torch.zeros((_SLOTS, len(STAGES) + 1), dtype=torch.int64).share_memory_()  # type: ignore[no-untyped-call]
        self._view: np.ndarray | None = None
        self._slot: int | None = None
        self._pid = 0

    def _row(self) -> np.ndarray:
        if self._view is None:
            self._view = self._tensor.numpy()
        # (Per process: a forked worker inherits the main process's slot with the object.)
        if self._slot is None or self._pid != os.getpid():
            info = get_worker_info()
            self._slot, self._pid = 0 if info is None else (info.id + 1) % _SLOTS, os.getpid()
        row: np.ndarray = self._view[self._slot]
        return row

    def add(self, stage: int, seconds: float, batches: int = 0) -> None:
        """Count ``seconds`` in stage ``stage`` (an index of `STAGES`) and ``batches`` made."""
        row = self._row()
        row[stage] = row.item(stage) + int(seconds * 1e9)
        if batches:
            row[BATCHES] = row.item(BATCHES) + batches

    def timed(self, items: Iterator[_T], stage: int, *, counts: bool = False) -> Iterator[_T]:
        """``items``, the time spent getting each counted in ``stage`` (``counts``: each item
        also counted as a batch made)."""
        clock = time.perf_counter
        while True:
            start = clock()
            try:
                item = next(items)
            except StopIteration:
                self.add(stage, clock() - start)
                return
            self.add(stage, clock() - start, int(counts))
            yield item

    def timed_less(self, items: Iterator[_T], stage: int, less: tuple[int, ...]) -> Iterator[_T]:
        """``items``, the time spent getting each counted in ``stage`` less what this process
        counted in the stages ``less`` meanwhile (those nested inside: each second once)."""
        clock = time.perf_counter
        row = self._row()
        # (`row.item` a stage at a time: a fancy index and a sum cost 5 µs a batch.)
        while True:
            start, inner = clock(), sum(map(row.item, less))
            try:
                item = next(items)
            except StopIteration:
                return
            nested = (sum(map(row.item, less)) - inner) / 1e9
            self.add(stage, max(0.0, clock() - start - nested))
            yield item

    def seconds(self) -> np.ndarray:
        """Shape ``(slots, len(STAGES) + 1)``: each process's seconds in each stage, then the
        batches it made (slot 0 the main process, ``w + 1`` worker ``w``)."""
        out: np.ndarray = self._tensor.numpy().astype(np.float64)
        out[:, : len(STAGES)] /= 1e9
        return out

    def __getstate__(self) -> dict[str, object]:
        return {"tensor": self._tensor}

    def __setstate__(self, state: dict[str, object]) -> None:
        tensor = state["tensor"]
        assert isinstance(tensor, torch.Tensor)
        self._tensor = tensor
        self._view = None
        self._slot = None
        self._pid = 0
