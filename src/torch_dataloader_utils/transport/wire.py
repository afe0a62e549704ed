"""The messages a worker sends: `Bundle` (pickled outputs) and `PackedBundle` (torch batches
packed into one shared buffer), how they are packed (`pack`) and unpacked. How each value lies
in the buffer is `values`.
"""

from __future__ import annotations

import math
import pickle
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import torch

from ..convert import IN_PLACE, Field, Gather, Planned, as_numpy
from ..errors import DataError
from ..errors.on_error import ReadFailure
from . import buffers
from .buffers import (
    _ALIGN,
    _HEADER,
    BufferBundle,
    Taken,
    _release,
    _round_up,
    incoming,
    take_buffer,
)
from .values import (
    _arrow_type,
    _dtype_of,
    _Entry,
    _loaded,
    _nbytes,
    _python_value,
    _string_arrays,
    _Strings,
    _torch_dtype,
)

__all__ = [
    "Bundle",
    "PackedBundle",
    "forget_exited_workers",
    "map_tensors",
    "pack",
    "pack_planned",
    "packed_nbytes",
]


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


class PackedBundle(BufferBundle):
    """Consecutive torch batches of one worker, their numeric data in one shared buffer.

    The buffer holds every batch's tensors first (``_HEADER`` to ``tensors_end``), then the
    Arrow offsets and bytes of their string/binary columns (to ``end``). It comes from the
    worker's pool (`BufferPool`) and goes back to it when the main process has copied the
    tensors out into memory of its own and made the strings' Python lists (`unpack`, or
    `pin_memory`): reusing buffers avoids creating a shared-memory region and faulting in its
    fresh pages for every message, which cost more than the copy
    (docs/adr/0003-bundled-packed-transport.md).

    A pooled buffer's memory is pickled with the first message in it only; later ones carry
    its serial number, and the main process finds the buffer it received (`Received`). A
    bundle no shared memory had room for (`memory`) has a private buffer, pickled as bytes.
    """

    __slots__ = ("entries", "tensors_end")

    def __init__(
        self,
        buffer: torch.Tensor,
        entries: list[list[_Entry]],
        tensors_end: int,
        end: int,
        worker: int = -1,
        *,
        serial: int | None = None,
        dropped: tuple[int, ...] = (),
        carrier: Any = None,
        pooled: bool = False,
    ) -> None:
        super().__init__(
            buffer, end, worker, serial=serial, dropped=dropped, carrier=carrier, pooled=pooled
        )
        self.entries = entries  # each batch's: where each of its fields lies
        self.tensors_end = tensors_end

    def __reduce__(self) -> tuple[Any, ...]:
        state = (self.entries, self.tensors_end, self.end, self.worker, self.failures)
        return (_unpickled, (*self.carried(), state))

    def pin_memory(self) -> PackedBundle:
        """Copy into pinned memory and give the shared buffer back (pin-memory thread)."""
        pinned = self.buffer[: self.end].pin_memory()
        if self.pooled:
            _release(self.buffer)
        bundle = PackedBundle(pinned, self.entries, self.tensors_end, self.end, self.worker)
        bundle.failures = self.failures
        return bundle

    def unpack(self) -> list[dict[str, Any]]:
        """The batches, as dicts of views into the bundle's buffer (`each`, all at once)."""
        return list(self.each())

    def each(self) -> Iterator[dict[str, Any]]:
        """The batches one at a time, as dicts of views into the bundle's buffer, each made
        when it is asked for: made at once, a bundle's batches (1,024 at batch 32) outlived
        two collections of the youngest objects, and those promoted brought a full collection
        of the main process's heap about once an epoch, ~130 ms
        (docs/benchmarks.md#a-bundles-batches-made-as-they-are-asked-for).

        A shared buffer is lent (`Lent`): it goes back to the worker's pool once every view
        of it is gone, so the main process copies nothing and spends less than half the CPU
        a row (docs/adr/0020-measurements-behind-constants.md#workers-and-the-transport). Without
        torch's use count the tensors are copied out first. String lists are made straight
        from the buffer.
        """
        buffer = self.buffer
        raw = buffer.numpy()
        own = buffer
        lent = False
        shared = self.pooled
        if shared:
            buffers._lent.settle()  # (before taking in another: buffers given back, reused soonest)
        if shared and (self.tensors_end > _HEADER or self._has_tensors()):
            borrowed = buffers._lent.lend(buffer)
            lent = borrowed is not None
            own = borrowed if borrowed is not None else buffer[: self.tensors_end].clone()
        # A view held until the last batch is made: the buffer is not given back while batches
        # are still to be made of it (strings read from it, a batch before any tensor's view).
        guard = own[:0]
        # The bytes viewed once per dtype: each value is then one slice (values start at a
        # multiple of _ALIGN), not a slice and two views.
        typed: dict[np.dtype[Any], torch.Tensor] = {}
        try:
            for fields in self.entries:
                batch: dict[str, Any] = {}
                for key, dtype, shape, where in fields:
                    if dtype is None or shape is None:
                        batch[key] = (
                            where.to_pylist(raw) if isinstance(where, _Strings) else _loaded(where)
                        )
                        continue
                    view = typed.get(dtype)
                    if view is None:
                        usable = own.numel() - own.numel() % dtype.itemsize
                        view = typed[dtype] = own[:usable].view(_torch_dtype(dtype))
                    start = where // dtype.itemsize
                    if len(shape) == 1:
                        batch[key] = view[start : start + shape[0]]
                    else:  # (one view, 1.2 µs; a slice then a reshape took 2.7)
                        batch[key] = view.as_strided(shape, _strides(shape), start)
                yield batch
        finally:
            del guard
            # Every copy out of the buffer (string lists, tensors unless lent) is complete
            # before the flag is cleared (program order; on weakly ordered CPUs the refcount
            # atomics around these calls are full barriers).
            if shared and not lent:
                _release(buffer)

    def _has_tensors(self) -> bool:
        # Empty tensors take no bytes but must not view the shared buffer either.
        return any(dtype is not None for fields in self.entries for _, dtype, _, _ in fields)


def _strides(shape: tuple[int, ...]) -> tuple[int, ...]:
    """A C-contiguous array's strides, in elements."""
    out = [1] * len(shape)
    for i in range(len(shape) - 1, 0, -1):
        out[i - 1] = out[i] * shape[i]
    return tuple(out)


def _unpickled(
    memory: torch.Tensor | np.ndarray | None,
    owner: tuple[int, int] | None,
    serial: int,
    dropped: tuple[int, ...],
    state: tuple[Any, ...],
) -> PackedBundle:
    buffer, pooled = incoming(memory, owner, serial, dropped)
    entries, tensors_end, end, worker, failures = state
    bundle = PackedBundle(buffer, entries, tensors_end, end, worker, carrier=buffer, pooled=pooled)
    bundle.failures = failures
    return bundle


def forget_exited_workers() -> None:
    """Unmap the pooled buffers of worker processes that have exited (`Received`)."""
    buffers._received.forget_exited()


def pack(batches: Sequence[list[Field]]) -> PackedBundle:
    """Pack the fields of several batches into one shared buffer.

    Every batch's tensors come first, then the string/binary columns' offsets and bytes, so
    that the main process copies only the tensors out (`PackedBundle.unpack`). Gathers
    (shuffled rows) are done straight into the buffer: one copy per value.
    """
    entries: list[list[_Entry]] = []
    tensors: list[tuple[int, int, np.dtype[Any], tuple[int, ...], Field]] = []
    strings: list[tuple[_Strings, np.ndarray, np.ndarray]] = []
    offset = _HEADER
    for fields in batches:
        placed: list[_Entry] = []
        for field in fields:
            shape = field.shape
            if shape is None:
                data = field.data
                arrays = _string_arrays(data) if isinstance(data, pa.Array) else None
                if arrays is None:
                    placed.append((field.key, None, None, _python_value(field.key, data)))
                    continue
                offsets, values = arrays
                place = _Strings(_arrow_type(field), len(offsets) - 1, 0, 0, len(values))
                strings.append((place, offsets, values))  # placed after all tensors, below
                placed.append((field.key, None, None, place))
                continue
            dtype = _dtype_of(field)
            nbytes = _nbytes(shape, dtype)
            placed.append((field.key, dtype, shape, offset))
            tensors.append((offset, nbytes, dtype, shape, field))
            offset += _round_up(nbytes, _ALIGN)
        entries.append(placed)
    tensors_end = offset
    copies: list[tuple[int, np.ndarray]] = []
    for place, offsets, values in strings:
        place.offsets_at = offset
        copies.append((offset, offsets))
        offset += _round_up(offsets.nbytes, _ALIGN)
        place.values_at = offset
        copies.append((offset, values))
        offset += _round_up(values.nbytes, _ALIGN)
    taken, pooled = take_buffer(offset - _HEADER)
    buffer = taken.buffer
    target = buffer.numpy()
    for where, array in copies:
        target[where : where + array.nbytes] = array.view(np.uint8)
    for where, nbytes, dtype, shape, field in tensors:
        if not nbytes:
            continue
        out = target[where : where + nbytes].view(dtype).reshape(shape)
        data = field.data
        if isinstance(data, Gather):  # (the method: np.take's wrapper costs ~1 µs a call)
            data.array.take(data.rows, axis=0, out=out)
        elif isinstance(data, IN_PLACE):
            data.into(out)  # (lists laid out or padded, a block's parts: in the buffer)
        else:
            out[...] = as_numpy(field)
    return _bundle(taken, pooled, entries, tensors_end, offset)


def pack_planned(batches: Sequence[Planned]) -> PackedBundle:
    """`pack` for batches whose arrays one call each writes, in place (a packed batch's: one
    compiled pass), and may settle entries of their layout as it writes (`Planned`). None of
    `pack`'s work a field (its kind, a view and a writer each): a packed batch's transport cost
    ~20 µs of Python a batch in a worker
    (docs/benchmarks.md#packed-batches-written-in-one-call)."""
    entries: list[list[_Entry]] = []
    places: list[list[tuple[int, int, np.dtype[Any]]]] = []
    offset = _HEADER
    for planned in batches:
        placed: list[_Entry] = []
        at: list[tuple[int, int, np.dtype[Any]]] = []
        for key, dtype, shape in planned.layout:
            if dtype is None:  # (``shape`` holds the value)
                placed.append((key, None, None, _python_value(key, shape)))
                continue
            count = math.prod(shape)
            placed.append((key, dtype, shape, offset))
            at.append((offset // dtype.itemsize, count, dtype))  # (offsets: multiples of 64)
            offset += _round_up(count * dtype.itemsize, _ALIGN)
        entries.append(placed)
        places.append(at)
    taken, pooled = take_buffer(offset - _HEADER)
    raw = taken.buffer.numpy()
    typed: dict[np.dtype[Any], np.ndarray] = {}  # the buffer viewed once a dtype
    for planned, at, placed in zip(batches, places, entries, strict=True):
        views = []
        for start, count, dtype in at:
            view = typed.get(dtype)
            if view is None:
                view = typed[dtype] = raw[: raw.size - raw.size % dtype.itemsize].view(dtype)
            views.append(view[start : start + count])
        settled = planned.write(views)
        for index, value in (settled or {}).items():  # (what only the writing knew)
            key, dtype, shape, where = placed[index]
            if dtype is None:
                placed[index] = (key, None, None, _python_value(key, value))
            else:
                assert math.prod(value) <= math.prod(shape or ()), f"{key}: more than its place"
                placed[index] = (key, dtype, value, where)
    return _bundle(taken, pooled, entries, offset, offset)


def _bundle(
    taken: Taken, pooled: bool, entries: list[list[_Entry]], tensors_end: int, end: int
) -> PackedBundle:
    return PackedBundle(
        taken.buffer,
        entries,
        tensors_end,
        end,
        serial=taken.serial if pooled else None,
        dropped=taken.dropped,
        carrier=taken.carrier,
        pooled=pooled,
    )


def packed_nbytes(fields: Sequence[Field]) -> int:
    """About how many bytes ``fields`` take in a packed buffer."""
    total = 0
    for field in fields:
        if field.shape is not None:
            total += _nbytes(field.shape, _dtype_of(field))
        elif isinstance(field.data, pa.Array):
            total += field.data.nbytes
    return total
