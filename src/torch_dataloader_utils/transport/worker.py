"""The worker side: bundling switched on by the loader's ``worker_init_fn``, and what a dataset
yields in a worker (`worker_messages`).
"""

from __future__ import annotations

import ctypes
import gc
import math
import sys
from collections.abc import Callable, Iterable, Iterator
from itertools import islice
from typing import TYPE_CHECKING, Any, Protocol, TypeVar, runtime_checkable

import pyarrow as pa
import torch
from torch.utils.data import get_worker_info

from ..convert import Field, Planned
from ..errors.on_error import FailureLog
from .ipc import ArrowBundle, pack_arrow
from .memory import (
    BUNDLE_BYTES,
    bundle_bytes,
    dev_shm_fits,
    no_room,
    remove_left_behind,
    room_log,
)
from .wire import Bundle, PackedBundle, map_tensors, pack, pack_planned, packed_nbytes

if TYPE_CHECKING:
    from ..stream.blocks import Segment

__all__ = [
    "BUNDLE_BYTES",
    "Converts",
    "FieldsOf",
    "Plans",
    "bundle_rows",
    "enable_bundles",
    "init_worker",
    "starting_workers",
    "worker_messages",
]


class Converts(Protocol):
    """What converts a dataset's batches: a `convert.Converter` (`FieldsOf`), or a packed
    dataset's `stream.packing.PackedConverter` (`Plans`)."""

    @property
    def output_format(self) -> str:
        """``"torch"``, ``"numpy"``, ``"arrow"`` or ``"dict"``."""

    @property
    def list_format(self) -> str:
        """How lists become tensors (``"nested"``: finished in the main process)."""

    def __call__(self, batch: Any, rows: Any = None) -> Any:
        """Rows ``rows`` of ``batch`` in the output format."""

    def finish_torch(self, batch: dict[str, Any]) -> dict[str, Any]:
        """What is left to do in the main process."""


@runtime_checkable
class FieldsOf(Converts, Protocol):
    """A converter whose torch batches a worker packs field by field (`wire.pack`)."""

    def fields(self, batch: Any, rows: Any = None) -> list[Field]:
        """The converted fields of rows ``rows`` of ``batch`` (``None``: all)."""


@runtime_checkable
class Plans(Converts, Protocol):
    """A converter whose torch batches are each written by one call (`wire.pack_planned`)."""

    def planned(self, batch: Any) -> Planned:
        """The batch's layout and its writer."""


T = TypeVar("T")

_bundle_rows = 0
# A bundle closes at this many bytes even before `bundle_rows` rows: bounds the shared memory
# in flight for wide rows (token lists, images); set per worker from its room (`memory`).
_bundle_bytes = BUNDLE_BYTES


def enable_bundles(rows: int, nbytes: int = BUNDLE_BYTES) -> None:
    """Make this (worker) process send bundles of about ``rows`` rows, closed at ``nbytes``."""
    global _bundle_rows, _bundle_bytes
    _bundle_rows, _bundle_bytes = rows, nbytes


def bundle_rows() -> int:
    """Rows per bundle in this process; 0 when bundling is off."""
    return _bundle_rows


def init_worker(rows: int, user_init: Callable[[int], None] | None, worker_id: int) -> None:
    """``worker_init_fn`` of a TabularDataLoader: switch bundling on, then run the user's."""
    info = get_worker_info()
    workers = info.num_workers if info is not None else 1
    enable_bundles(rows, bundle_bytes(workers, tell=worker_id == 0))
    _keep_freed_memory()
    # (Transparent huge pages are left as the system sets them: turned off in workers, they
    # cost 11-20% more CPU a row; docs/adr/0036-workers-keep-huge-pages.md.)
    # What the worker holds from its start (torch's modules and the dataset: ~180k objects,
    # kept for its life) is left out of garbage collections: a full collection walked them
    # all, 0.15-0.4 s while it read and 0.35 s more at its exit, which ends the epoch
    # (docs/adr/0016-main-process-share.md#spawned-workers).
    gc.freeze()
    if user_init is not None:
        user_init(worker_id)


def _keep_freed_memory() -> None:
    """Let glibc's malloc keep freed memory in this (worker) process for reuse.

    Per-batch arrays of ~1 MB (padded token lists) were given back to the kernel on every free
    and faulted in again on the next allocation, half the conversion time
    (docs/adr/0020-measurements-behind-constants.md#workers-and-the-transport). Workers are our
    own processes, so tuning their allocator is ours to do; the main process is left alone.
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


def starting_workers() -> None:
    """Give back the memory pyarrow's pool keeps freed in this process, before workers fork.

    A forked worker's pool reuses it, and each page it writes is first copied from the
    parent's (copy on write): new pages cost the worker less
    (docs/adr/0020-measurements-behind-constants.md#a-workers-first-batch).
    """
    pa.default_memory_pool().release_unused()


def worker_messages(
    batches: Iterable[Segment],
    convert: Converts,
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
    if collate is None and convert.output_format == "torch":
        # All numeric data of a bundle in one shared buffer: one region per message, of at
        # most `bundle_rows` rows and about `_bundle_bytes` (wide rows: fewer rows).
        if isinstance(convert, Plans):  # (a packed batch: its arrays written in one call)
            planned = (convert.planned(b) for b, _ in batches)
            for written in _groups(planned, _planned_nbytes, per_bundle):
                yield _mark(pack_planned(written), worker, failures)
            return
        assert isinstance(convert, FieldsOf), "a converter gives fields or a planned batch"
        fields = (convert.fields(b, rows) for b, rows in batches)
        for group in _groups(fields, packed_nbytes, per_bundle):
            yield _mark(pack(group), worker, failures)
        return
    if collate is None and convert.output_format == "arrow":
        # Arrow IPC streams in one shared buffer, read in the main process without a copy.
        arrow = (convert(b, rows) for b, rows in batches)
        for group in _groups(arrow, _arrow_nbytes, per_bundle):
            yield _mark(pack_arrow(group), worker, failures)
        return
    size = 1
    outputs = (convert(b, rows) for b, rows in batches)
    if collate is not None:
        outputs = (collate(o) for o in outputs)
    while items := list(islice(outputs, size)):
        bundle = Bundle(items)
        # Dicts of lists, numpy arrays: no shared memory, pickled here. A collate_fn's
        # tensors go to /dev/shm as torch sends them, or, without room, as bytes.
        sealed = collate is None or not _shared(items)
        yield _mark(bundle.seal() if sealed else bundle, worker, failures)
        size = min(size * 2, per_bundle)


def _groups(outputs: Iterable[T], nbytes: Callable[[T], int], most: int) -> Iterator[list[T]]:
    """``outputs`` in consecutive groups of 1, 2, 4 ... up to ``most``, each closed early at
    `_bundle_bytes` (a bundle stays within its bytes where its outputs allow)."""
    group: list[T] = []
    total, size = 0, 1
    for output in outputs:
        more = nbytes(output)
        if group and total + more > _bundle_bytes:
            yield group
            group, total, size = [], 0, min(size * 2, most)
        group.append(output)
        total += more
        if len(group) >= size or total >= _bundle_bytes:
            yield group
            group, total, size = [], 0, min(size * 2, most)
    if group:
        yield group


def _planned_nbytes(planned: Planned) -> int:
    return planned.nbytes


def _arrow_nbytes(output: Any) -> int:
    return int(output.nbytes) if isinstance(output, pa.RecordBatch | pa.Table) else 0


def _shared(items: list[Any]) -> bool:
    """Move the tensors in ``items`` to torch's shared memory here (torch would when sending);
    False when /dev/shm has no room for them."""
    tensors = _tensors(items)
    nbytes = sum(int(t.nbytes) for t in tensors if not t.untyped_storage().is_shared())
    try:
        if not dev_shm_fits(nbytes):  # (asked first: a failed allocation leaves a file)
            raise RuntimeError("unable to allocate shared memory(shm): checked before")
        for tensor in tensors:
            tensor.share_memory_()  # type: ignore[no-untyped-call]
    except RuntimeError as exc:  # torch: "unable to allocate shared memory(shm) ... (28)"
        if "shared memory" not in str(exc) and "shm" not in str(exc):
            raise
        remove_left_behind()
        room_log(
            "collated",
            f"{no_room(nbytes, dev_shm=True)} (a collated batch): batches that do not fit go "
            "through the pipe (one copy more)",
        )
        return False
    return True


def _tensors(value: Any) -> list[torch.Tensor]:
    found: list[torch.Tensor] = []

    def keep(tensor: torch.Tensor) -> torch.Tensor:
        found.append(tensor)
        return tensor

    map_tensors(value, keep)
    return found


def _mark(
    bundle: PackedBundle | ArrowBundle | Bundle, worker: int, failures: FailureLog | None
) -> PackedBundle | ArrowBundle | Bundle:
    bundle.worker = worker
    if failures is not None:
        bundle.failures = failures.drain()
    return bundle
