"""Moving batches from DataLoader workers to the main process cheaply.

Measured (FACTS.md): each tensor that crosses from a worker costs ~0.35 ms, most of it creating
and passing a new shared-memory segment, not copying bytes. So a worker of a
`TabularDataLoader` sends *bundles*: several consecutive
batches in one message, and for torch output all their numeric data packed into ONE shared
buffer, allocated directly in shared memory. The main process slices the buffer into per-batch
views (a few microseconds) and yields the batches one by one, so users see ordinary batches.

Bundling is switched on per worker process by the loader's ``worker_init_fn``; a dataset
iterated by a plain ``DataLoader`` (or in the main process) yields plain batches.
"""

from __future__ import annotations

import ctypes
import math
import pickle
import sys
import threading
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from itertools import islice
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
import torch

from .convert import Converter, Field, Gather, as_numpy
from .errors import DataError
from .fs.forks import ProcessLocal
from .skipping import FailureLog, ReadFailure, log_failure

if TYPE_CHECKING:
    from .batching import Segment

__all__ = [
    "BUNDLE_BYTES",
    "Bundle",
    "BufferPool",
    "Landing",
    "PackedBundle",
    "bundle_rows",
    "enable_bundles",
    "init_worker",
    "pack",
    "packed_nbytes",
    "Unbundler",
    "map_tensors",
    "worker_messages",
]

_ALIGN = 64
# A bundle closes at this many bytes even before `bundle_rows` rows: bounds the shared memory
# in flight and the main process's landing regions for wide rows (token lists, images).
BUNDLE_BYTES = 8 * 2**20
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


def map_tensors(value: Any, fn: Callable[[torch.Tensor], torch.Tensor]) -> Any:
    """``value`` with ``fn`` applied to every tensor in it (dicts, lists, tuples, namedtuples)."""
    if isinstance(value, torch.Tensor):
        return fn(value)
    if isinstance(value, dict):
        return {k: map_tensors(v, fn) for k, v in value.items()}
    if isinstance(value, list | tuple) and any(isinstance(v, torch.Tensor | dict) for v in value):
        mapped = [map_tensors(v, fn) for v in value]
        if hasattr(value, "_fields"):  # a namedtuple
            return type(value)(*mapped)
        return type(value)(mapped)
    return value  # strings, lists of Python objects: no tensors


def _pin(value: Any) -> Any:
    return map_tensors(value, torch.Tensor.pin_memory)


class Bundle:
    """Consecutive outputs of one worker sent as one message (non-packed outputs)."""

    __slots__ = ("failures", "items", "sealed", "worker")

    def __init__(self, items: list[Any], worker: int = -1) -> None:
        self.items: list[Any] | None = items
        self.sealed: bytes | None = None  # the items pickled by `seal`
        self.worker = worker  # the DataLoader worker that sent it
        self.failures: tuple[ReadFailure, ...] = ()  # reads skipped since the last message

    def seal(self) -> Bundle:
        """Pickle the items now, in the worker's own thread: DataLoader pickles messages in a
        queue's feeder thread, where a failure is printed and the message dropped, and the
        main process would then only see a worker with batches missing. Used for Arrow,
        dict and numpy outputs (no shared-memory handles: pickled once either way).

        Raises:
            DataError: the items cannot be pickled (names the columns' types).
        """
        try:
            self.sealed = pickle.dumps(self.items, protocol=pickle.HIGHEST_PROTOCOL)
        except Exception as exc:
            kinds = sorted({str(t) for item in self.items or [] for t in _types_of(item)})
            raise DataError(
                f"a batch cannot be sent from its worker to the main process ({exc}); its "
                f"column types: {', '.join(kinds)}; read with num_workers=0, or select "
                "other columns"
            ) from exc
        self.items = None
        return self

    def pin_memory(self) -> Bundle:
        """Pin every tensor inside (called by the DataLoader's pin-memory thread)."""
        pinned = Bundle([_pin(item) for item in self.unpack()], self.worker)
        pinned.failures = self.failures
        return pinned

    def unpack(self) -> list[Any]:
        """The outputs, in order."""
        if self.items is None:
            assert self.sealed is not None
            self.items, self.sealed = pickle.loads(self.sealed), None
        return self.items


def _types_of(item: Any) -> list[pa.DataType]:
    return list(item.schema.types) if isinstance(item, pa.RecordBatch | pa.Table) else []


_TORCH_DTYPES: dict[np.dtype[Any], torch.dtype] = {}


def _torch_dtype(dtype: np.dtype[Any]) -> torch.dtype:
    found = _TORCH_DTYPES.get(dtype)
    if found is None:
        found = torch.from_numpy(np.empty(0, dtype=dtype)).dtype
        _TORCH_DTYPES[dtype] = found
    return found


# One entry per output value: (key, dtype, shape, byte offset) for packed arrays;
# (key, None, None, _Strings) for string/binary columns packed as Arrow buffers; or
# (key, None, None, _Pickled) for Python values, pickled in the worker.
_Entry = tuple[str, "np.dtype[Any] | None", "tuple[int, ...] | None", Any]


class _Strings:
    """Where a packed string/binary column's Arrow offsets and bytes lie in the buffer."""

    __slots__ = ("nbytes", "offsets_at", "rows", "type", "values_at")

    def __init__(
        self, type: pa.DataType, rows: int, offsets_at: int, values_at: int, nbytes: int
    ) -> None:
        self.type, self.rows, self.offsets_at = type, rows, offsets_at
        self.values_at, self.nbytes = values_at, nbytes

    def to_pylist(self, buffer: np.ndarray) -> list[Any]:
        offsets = buffer[self.offsets_at : self.offsets_at + 4 * (self.rows + 1)]
        values = buffer[self.values_at : self.values_at + self.nbytes]
        array = pa.Array.from_buffers(
            self.type, self.rows, [None, pa.py_buffer(offsets), pa.py_buffer(values)]
        )
        return list(array.to_pylist())


def _string_parts(array: pa.Array) -> tuple[np.ndarray, np.ndarray] | None:
    """Rebased int32 offsets and the bytes of a null-free string/binary array, else None."""
    if array.null_count or not (pa.types.is_string(array.type) or pa.types.is_binary(array.type)):
        return None
    _, offsets_buffer, data = array.buffers()
    if offsets_buffer is None or data is None or not len(array):
        return np.zeros(len(array) + 1, np.int32), np.empty(0, np.uint8)
    start = array.offset
    offsets = np.frombuffer(offsets_buffer, dtype=np.int32)[start : start + len(array) + 1]
    first, last = int(offsets[0]), int(offsets[-1])
    return offsets - offsets[0], np.frombuffer(data, dtype=np.uint8)[first:last]


class PackedBundle:
    """Consecutive torch batches of one worker, their numeric data in one shared buffer.

    The buffer holds every batch's tensors first (``_HEADER`` to ``tensors_end``), then the
    Arrow offsets and bytes of their string/binary columns (to ``end``). It comes from the
    worker's pool (`BufferPool`) and goes back to it when the main process has copied the
    tensors out into memory of its own and made the strings' Python lists (`unpack`, or
    `pin_memory`): reusing buffers avoids creating a shared-memory segment and faulting in its
    fresh pages for every message, which cost more than the copy (measured).
    """

    __slots__ = ("buffer", "end", "failures", "layouts", "tensors_end", "worker")

    def __init__(
        self,
        buffer: torch.Tensor,
        layouts: list[list[_Entry]],
        tensors_end: int,
        end: int,
        worker: int = -1,
    ) -> None:
        self.buffer = buffer
        self.layouts = layouts
        self.tensors_end = tensors_end
        self.end = end
        self.worker = worker  # the DataLoader worker that sent it
        self.failures: tuple[ReadFailure, ...] = ()  # reads skipped since the last message

    def pin_memory(self) -> PackedBundle:
        """Copy into pinned memory and give the shared buffer back (pin-memory thread)."""
        pinned = self.buffer[: self.end].pin_memory()
        _release(self.buffer)
        bundle = PackedBundle(pinned, self.layouts, self.tensors_end, self.end, self.worker)
        bundle.failures = self.failures
        return bundle

    def unpack(self) -> list[dict[str, Any]]:
        """The batches, as dicts of views into a private copy of the bundle's tensor bytes.

        The copy goes to memory of the main process's own (`Landing`), one region per bundle,
        unless the buffer is private already (pinned by the pin-memory thread). Only the
        tensors are copied: string lists are made straight from the shared buffer, before it
        is released. (Copying the strings' bytes too cost ~1 µs per 4 KB value in the main
        process, ~40% of its time on wide binary columns; measured.)
        """
        buffer = self.buffer
        raw = buffer.numpy()
        shared = _is_shared(buffer)
        own = buffer
        if shared and (self.tensors_end > _HEADER or self._has_tensors()):
            own = _landing.take(self.tensors_end)
            own[_HEADER:] = buffer[_HEADER : self.tensors_end]
        batches = []
        for layout in self.layouts:
            batch: dict[str, Any] = {}
            for key, dtype, shape, where in layout:
                if dtype is None or shape is None:
                    batch[key] = (
                        where.to_pylist(raw) if isinstance(where, _Strings) else where.load()
                    )
                else:
                    nbytes = _nbytes(shape, dtype)
                    batch[key] = own[where : where + nbytes].view(_torch_dtype(dtype)).view(shape)
            batches.append(batch)
        # Every copy out of the buffer (tensors, string lists) is complete before the flag is
        # cleared (program order; on weakly ordered CPUs the refcount atomics around these
        # calls are full barriers).
        _release(buffer)
        return batches

    def _has_tensors(self) -> bool:
        # Empty tensors take no bytes but must not view the shared buffer either.
        return any(dtype is not None for layout in self.layouts for _, dtype, _, _ in layout)


# A pooled buffer starts with a header; its first byte says whether the main process has
# given it back. Both processes map the same pages, so the flag needs no other channel.
_HEADER = _ALIGN
_FREE, _IN_USE = 0, 1


def _new_shared(nbytes: int) -> torch.Tensor:
    new_shared = getattr(torch.UntypedStorage, "_new_shared", None)
    if new_shared is None:  # private in torch: fall back to the public (one more copy) way
        shared: torch.Tensor = torch.empty(nbytes, dtype=torch.uint8)
        return shared.share_memory_()  # type: ignore[no-untyped-call,no-any-return]
    return torch.empty(0, dtype=torch.uint8).set_(new_shared(nbytes))


def _is_shared(tensor: torch.Tensor) -> bool:
    return bool(tensor.is_shared())  # type: ignore[no-untyped-call]


def _release(buffer: torch.Tensor) -> None:
    if _is_shared(buffer) and buffer.numel() >= _HEADER:
        buffer[0] = _FREE


class BufferPool:
    """Shared-memory buffers a worker reuses once the main process has released them.

    Args:
        size: buffers kept; when all are in flight a new one is made (and replaces the
            oldest in the pool, which is then freed when the main process drops it).
    """

    def __init__(self, size: int = 4) -> None:
        self.size = size
        # Per process: a forked process inherits the pool, whose pages it shares with its
        # parent and siblings: it must never write to them, so it starts afresh.
        self._buffers: ProcessLocal[list[torch.Tensor]] = ProcessLocal(list)

    def take(self, nbytes: int) -> torch.Tensor:
        """A buffer of at least ``_HEADER + nbytes`` bytes, marked in use."""
        buffers = self._buffers.get()
        for i, buffer in enumerate(buffers):
            if int(buffer[0]) == _FREE and buffer.numel() >= _HEADER + nbytes:
                buffers.append(buffers.pop(i))  # most recently used last
                buffer[0] = _IN_USE
                return buffer
        # Round up so that a slightly larger next message still fits.
        buffer = _new_shared(_round_up(_HEADER + nbytes, _POOL_GRAIN))
        buffer[0] = _IN_USE
        buffers.append(buffer)
        if len(buffers) > self.size:
            buffers.pop(0)
        return buffer


class Landing:
    """Private memory of the main process that unpacked batches are views of.

    A region is reused once the user has dropped every batch that views it (its storage has
    no other reference). Fresh allocations fault in fresh pages: a per-batch ``clone`` ran
    ~10x slower than ``memcpy`` here (measured), one ``clone`` per bundle ~4x slower.
    """

    def __init__(self, size: int = 4) -> None:
        self.size = size
        self._regions: list[tuple[torch.Tensor, int]] = []
        self._lock = threading.Lock()

    def take(self, nbytes: int) -> torch.Tensor:
        """A view of ``nbytes`` bytes of a region that nothing else references.

        The returned view itself marks the region in use (loaders iterated in several threads
        of one process share the landing).
        """
        with self._lock:
            for i, (region, alone) in enumerate(self._regions):
                count = _use_count(region)
                if region.numel() >= nbytes and count is not None and count == alone:
                    self._regions.append(self._regions.pop(i))
                    return region[:nbytes]
            region = torch.empty(_round_up(nbytes, _POOL_GRAIN), dtype=torch.uint8)
            base = _use_count(region)
            if base is not None:  # without a use count a region is never reused
                self._regions.append((region, base))
                if len(self._regions) > self.size:
                    self._regions.pop(0)
            return region[:nbytes]


def _use_count(tensor: torch.Tensor) -> int | None:
    # How many tensors (views) share the storage. A private torch function: when it is
    # missing, None, and the landing never reuses a region (only slower).
    counter = getattr(torch._C, "_storage_Use_Count", None)
    if counter is None:
        return None
    return int(counter(tensor.untyped_storage()._cdata))


def _round_up(n: int, grain: int) -> int:
    return -(-n // grain) * grain


def _nbytes(shape: tuple[int, ...], dtype: np.dtype[Any]) -> int:
    count = 1
    for n in shape:
        count *= n
    return count * dtype.itemsize


_POOL_GRAIN = 1 << 20
_landing = Landing()
_KEEP_MAPPED = 16  # a few workers x the pool size of each (BufferPool)
_pool = BufferPool()


def pack(batches: Sequence[list[Field]]) -> PackedBundle:
    """Pack the fields of several batches into one shared buffer.

    Every batch's tensors come first, then the string/binary columns' offsets and bytes, so
    that the main process copies only the tensors out (`PackedBundle.unpack`). Gathers
    (shuffled rows) are done straight into the buffer: one copy per value.
    """
    layouts: list[list[_Entry]] = []
    sources: list[tuple[int, np.dtype[Any], tuple[int, ...], Field]] = []
    strings: list[tuple[_Strings, np.ndarray, np.ndarray]] = []
    offset = _HEADER
    for fields in batches:
        layout: list[_Entry] = []
        for field in fields:
            if field.shape is None:
                parts = _string_parts(field.data) if isinstance(field.data, pa.Array) else None
                if parts is None:
                    layout.append((field.key, None, None, _Pickled.of(field.key, field.data)))
                    continue
                offsets, values = parts
                place = _Strings(_arrow_type(field), len(offsets) - 1, 0, 0, len(values))
                strings.append((place, offsets, values))  # placed after all tensors, below
                layout.append((field.key, None, None, place))
                continue
            dtype = _dtype_of(field)
            layout.append((field.key, dtype, field.shape, offset))
            sources.append((offset, dtype, field.shape, field))
            offset += _round_up(_nbytes(field.shape, dtype), _ALIGN)
        layouts.append(layout)
    tensors_end = offset
    copies: list[tuple[int, np.ndarray]] = []
    for place, offsets, values in strings:
        place.offsets_at = offset
        copies.append((offset, offsets))
        offset += _round_up(offsets.nbytes, _ALIGN)
        place.values_at = offset
        copies.append((offset, values))
        offset += _round_up(values.nbytes, _ALIGN)
    buffer = _pool.take(offset - _HEADER)
    target = buffer.numpy()
    for where, array in copies:
        target[where : where + array.nbytes] = array.view(np.uint8)
    for where, dtype, shape, field in sources:
        nbytes = _nbytes(shape, dtype)
        if not nbytes:
            continue
        out = target[where : where + nbytes].view(dtype).reshape(shape)
        if isinstance(field.data, Gather):
            np.take(field.data.source, field.data.rows, axis=0, out=out)
        else:
            out[...] = as_numpy(field)
    return PackedBundle(buffer, layouts, tensors_end, offset)


def _arrow_type(field: Field) -> pa.DataType:
    assert isinstance(field.data, pa.Array)  # checked by the caller
    return field.data.type


def packed_nbytes(fields: Sequence[Field]) -> int:
    """About how many bytes ``fields`` take in a packed buffer."""
    total = 0
    for field in fields:
        if field.shape is not None:
            total += _nbytes(field.shape, _dtype_of(field))
        elif isinstance(field.data, pa.Array):
            total += field.data.nbytes
    return total


def _pylist(data: Any) -> Any:
    return data.to_pylist() if isinstance(data, pa.Array) else data


class _Pickled:
    """A column's Python values, pickled in the worker's own thread: DataLoader pickles a
    message in a queue's feeder thread, where a failure is printed and the message dropped
    (the main process would only see batches missing). Pickled once either way."""

    __slots__ = ("blob",)

    def __init__(self, blob: bytes) -> None:
        self.blob = blob

    @classmethod
    def of(cls, key: str, data: Any) -> _Pickled:
        """Raises: DataError: the values cannot be pickled (names the column)."""
        values = _pylist(data)
        try:
            return cls(pickle.dumps(values, protocol=pickle.HIGHEST_PROTOCOL))
        except Exception as exc:
            kinds = sorted({type(v).__name__ for v in values}) if isinstance(values, list) else []
            raise DataError(
                f"column {key!r}: its values ({', '.join(kinds)}) cannot be sent from the "
                f"worker to the main process ({exc}); read with num_workers=0, or decode "
                "the column to picklable values"
            ) from exc

    def load(self) -> Any:
        return pickle.loads(self.blob)


def _dtype_of(field: Field) -> np.dtype[Any]:
    data = field.data
    if isinstance(data, Gather):
        return np.dtype(data.source.dtype)
    if isinstance(data, np.ndarray):
        return np.dtype(data.dtype)
    if isinstance(data, pa.Array):
        dtype: np.dtype[Any] = np.dtype(data.type.to_pandas_dtype())
        return dtype
    raise TypeError(f"field {field.key!r} holds {type(data).__name__}, not an array")


class Unbundler:
    """Unpacks the messages of a TabularDataLoader's workers into batches.

    Args:
        finish: applied to each batch unpacked from a `PackedBundle` (the worker could not
            finish those: nested tensors are built after the hop).
        failures: where the reads the workers skipped (``on_error="skip"``) are collected.
    """

    def __init__(
        self,
        finish: Callable[[dict[str, Any]], dict[str, Any]] | None = None,
        failures: list[ReadFailure] | None = None,
    ) -> None:
        self.finish = finish
        self.failures = failures
        # Keeping the last buffers referenced keeps their shared-memory mappings alive: torch
        # then finds a pooled buffer that comes back in its cache instead of mapping (and
        # faulting in) its pages again.
        self.recent: deque[torch.Tensor] = deque(maxlen=_KEEP_MAPPED)

    def __call__(self, item: Any) -> list[Any]:
        """The batches of one message (anything but a bundle is one batch)."""
        if self.failures is not None and isinstance(item, PackedBundle | Bundle):
            for failure in item.failures:
                log_failure(failure)
                self.failures.append(failure)
        if isinstance(item, PackedBundle):
            if _is_shared(item.buffer):  # not a pinned copy: nothing to keep mapped
                self.recent.append(item.buffer)
            batches = item.unpack()
            return batches if self.finish is None else [self.finish(b) for b in batches]
        if isinstance(item, Bundle):
            return item.unpack()
        return [item]


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
