"""The worker side: bundling switched on by the loader's ``worker_init_fn``, and what a dataset
yields in a worker (`worker_messages`).
"""

from __future__ import annotations

import ctypes
import math
import sys
from collections.abc import Callable, Iterable, Iterator
from itertools import islice
from typing import TYPE_CHECKING, Any

from ..convert import Converter, Field
from ..skipping import FailureLog
from .wire import Bundle, PackedBundle, pack, packed_nbytes

if TYPE_CHECKING:
    from ..stream.blocks import Segment

__all__ = ["BUNDLE_BYTES", "bundle_rows", "enable_bundles", "init_worker", "worker_messages"]

# A bundle closes at this many bytes even before `bundle_rows` rows: bounds the shared memory
# in flight for wide rows (token lists, images). Each message costs the main process ~0.5 ms of
# CPU (DataLoader's queue ~0.35 ms, unpacking ~0.2), so wide rows want large bundles. Measured,
# 125k token rows of ~2 KB with 2 workers: 0.20 µs of main-process CPU a row at 16 MiB, 0.12 at
# 32. But 32 MiB would double the shared memory a worker's pool holds (6 buffers: 192 MiB;
# Docker gives /dev/shm 64 MiB by default), so 16.
BUNDLE_BYTES = 16 * 2**20


_bundle_rows = 0


def enable_bundles(rows: int) -> None:
    """Make this (worker) process send bundles of about ``rows`` rows."""
    global _bundle_rows
    _bundle_rows = rows


def bundle_rows() -> int:
    """Rows per bundle in this process; 0 when bundling is off."""
    return _bundle_rows


def init_worker(rows: int, user_init: Callable[[int], None] | None, worker_id: int) -> None:
    """``worker_init_fn`` of a TabularDataLoader: switch bundling on, then run the user's."""
    enable_bundles(rows)
    _keep_freed_memory()
    if user_init is not None:
        user_init(worker_id)


def _keep_freed_memory() -> None:
    """Let glibc's malloc keep freed memory in this (worker) process for reuse.

    Per-batch arrays of ~1 MB (padded token lists) were given back to the kernel on every free
    and faulted in again on the next allocation: ~240 page faults per batch, half the
    conversion time (measured: 1.2 M -> 2.5 M rows/s for token lists). Workers are our own
    processes, so tuning their allocator is ours to do; the main process is left alone.
    """
    if sys.platform != "linux":
        return
    try:
        libc = ctypes.CDLL("libc.so.6")
        libc.mallopt(_M_MMAP_THRESHOLD, 32 * 2**20)
        libc.mallopt(_M_TRIM_THRESHOLD, 256 * 2**20)
    except (OSError, AttributeError):  # not glibc (musl, ...): nothing to tune
        return


_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3  # from glibc's malloc.h


def worker_messages(
    batches: Iterable[Segment],
    convert: Converter,
    collate: Callable[[Any], Any] | None,
    *,
    worker: int,
    batch_size: int,
    failures: FailureLog | None = None,
) -> Iterator[Any]:
    """What a dataset yields for its ``batches``: converted (and collated) batches, or, in a
    `TabularDataLoader` worker (bundling on), bundles of them marked with ``worker`` and
    carrying the ``failures`` (``on_error="skip"``) logged since the previous bundle.

    The loader puts batches back in DataLoader's order (one per worker in turn) from the marks.
    Bundles ramp up 1, 2, 4 ... batches, so the first batch leaves the worker as soon as it is
    ready.
    """
    per_bundle = math.ceil(bundle_rows() / batch_size) if bundle_rows() else 0
    if not per_bundle:
        outputs = (convert(b, rows) for b, rows in batches)
        yield from outputs if collate is None else (collate(o) for o in outputs)
        return
    size = 1
    if collate is None and convert.output_format == "torch":
        # All numeric data of a bundle in one shared buffer: one segment per message, of at
        # most `bundle_rows` rows and about BUNDLE_BYTES (wide rows: fewer rows).
        group: list[list[Field]] = []
        nbytes = 0
        for batch, rows in batches:
            group.append(convert.fields(batch, rows))
            nbytes += packed_nbytes(group[-1])
            if len(group) >= size or nbytes >= BUNDLE_BYTES:
                yield _mark(pack(group), worker, failures)
                group, nbytes, size = [], 0, min(size * 2, per_bundle)
        if group:
            yield _mark(pack(group), worker, failures)
        return
    outputs = (convert(b, rows) for b, rows in batches)
    if collate is not None:
        outputs = (collate(o) for o in outputs)
    seal = collate is None  # Arrow batches, dicts of lists, numpy arrays: no shared memory
    while items := list(islice(outputs, size)):
        bundle = Bundle(items)
        yield _mark(bundle.seal() if seal else bundle, worker, failures)
        size = min(size * 2, per_bundle)


def _mark(
    bundle: PackedBundle | Bundle, worker: int, failures: FailureLog | None
) -> PackedBundle | Bundle:
    bundle.worker = worker
    if failures is not None:
        bundle.failures = failures.drain()
    return bundle
