"""``num_workers="auto"``: the DataLoader workers a rank gets, from its cores and a short
measurement of its data (`choose_workers`; docs/adr/0033-where-the-time-goes.md).

A worker pays when making a batch costs more than sending it across: the main process then
only unpacks, and the workers make batches side by side. With fewer than two cores a rank
(``LOCAL_WORLD_SIZE`` ranks sharing the machine's), a worker would take turns with the
training loop for the one core. Otherwise each of the rank's cores gets a worker, up to
`MAX_WORKERS`.
"""

from __future__ import annotations

import logging
import os
import statistics
import time
from collections.abc import Iterator
from typing import Any

import torch

__all__ = ["MAX_WORKERS", "choose_workers", "cores_per_rank"]

logger = logging.getLogger("torch_dataloader_utils")

# More workers than this rarely read faster and each holds its blocks in memory.
MAX_WORKERS = 8
# A batch's crossing from a worker: a fixed cost (the message, the queue, unpacking) and its
# bytes copied once; measured on the demo data (docs/adr/0033-where-the-time-goes.md).
CROSS_FIXED_S = 0.2e-3
CROSS_BYTES_PER_S = 4e9
# The measurement: batches made in the main process after a first (which reads the first
# block), and the time it may take.
MEASURE_BATCHES, MEASURE_S = 8, 0.5


def cores_per_rank() -> tuple[int, int]:
    """The cores this process may run on and the ranks on this machine
    (``LOCAL_WORLD_SIZE``, default 1)."""
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # (not Linux)
        cores = os.cpu_count() or 1
    try:
        local = max(1, int(os.environ.get("LOCAL_WORLD_SIZE", "1")))
    except ValueError:
        local = 1
    return cores, local


def choose_workers(batches: Iterator[Any] | None, *, cores: int, local: int) -> tuple[int, str]:
    """The workers to use and why.

    Args:
        batches: the dataset's batches made in this process (read from the start of the
            epoch; closed here), or ``None`` to decide from the cores alone.
        cores: the cores this process may run on.
        local: the ranks on this machine.
    """
    per_rank = max(1, cores // local)
    where = f"{cores} core{'s' * (cores != 1)} for {local} rank{'s' * (local != 1)} here"
    if per_rank < 2:
        return 0, f"{where}: one core a rank, which a worker would take turns at with the loop"
    made = None if batches is None else _measure(batches)
    count = min(per_rank, MAX_WORKERS)
    if made is None:
        return count, f"{where}: a worker a core (up to {MAX_WORKERS})"
    seconds, nbytes = made
    cross = CROSS_FIXED_S + nbytes / CROSS_BYTES_PER_S
    if seconds < 2 * cross:
        return 0, (
            f"{where}, but a batch takes {1e3 * seconds:.2f} ms to make here and about "
            f"{1e3 * cross:.2f} ms to cross from a worker: workers would not pay"
        )
    return count, (
        f"{where}; a batch takes {1e3 * seconds:.2f} ms to make and about {1e3 * cross:.2f} ms "
        f"to cross from a worker: a worker a core (up to {MAX_WORKERS})"
    )


def _measure(batches: Iterator[Any]) -> tuple[float, int] | None:
    """Seconds a batch and its bytes, over the first batches (None: too few).

    The first batch is counted: it waits for the first block's reading, which a worker would
    do too, and the batches after it are made from that block without reading. Leaving it
    out measured the making alone, near the crossing's cost on the demo data: the pick
    flipped between 0 and 2 workers from run to run, where 2 read 25% faster. The batches
    after it count at their median: one step the scheduler held up on a loaded machine
    (a few ms, more than eight cheap batches together) would otherwise decide alone."""
    try:
        start = time.perf_counter()
        first = next(batches, None)
        if first is None:
            return None
        then = time.perf_counter()
        first_s, nbytes = then - start, _bytes(first)
        rest: list[float] = []
        while len(rest) < MEASURE_BATCHES and then - start < MEASURE_S:
            batch = next(batches, None)
            if batch is None:
                break
            now = time.perf_counter()
            rest.append(now - then)
            then = now
            nbytes += _bytes(batch)
        if not rest:
            return None
        made = 1 + len(rest)
        return (first_s + len(rest) * statistics.median(rest)) / made, nbytes // made
    finally:
        close = getattr(batches, "close", None)
        if close is not None:
            close()


def _bytes(batch: Any) -> int:
    """A batch's tensors' and arrays' bytes."""
    values = batch.values() if isinstance(batch, dict) else [batch]
    total = 0
    for value in values:
        if isinstance(value, torch.Tensor):
            total += value.numel() * value.element_size()
        else:
            total += int(getattr(value, "nbytes", 0) or 0)
    return total
