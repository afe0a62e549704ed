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

from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import torch

from .convert import Field, Gather, as_numpy

__all__ = [
    "Bundle",
    "PackedBundle",
    "bundle_rows",
    "enable_bundles",
    "init_worker",
    "pack",
    "unbundle",
]

_ALIGN = 64
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
    if user_init is not None:
        user_init(worker_id)


def _pin(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return value.pin_memory()
    if isinstance(value, dict):
        return {k: _pin(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return type(value)(_pin(v) for v in value)
    return value


class Bundle:
    """Consecutive outputs of one worker sent as one message (non-packed outputs)."""

    __slots__ = ("items",)

    def __init__(self, items: list[Any]) -> None:
        self.items = items

    def pin_memory(self) -> Bundle:
        """Pin every tensor inside (called by the DataLoader's pin-memory thread)."""
        return Bundle([_pin(item) for item in self.items])

    def unpack(self) -> list[Any]:
        """The outputs, in order."""
        return self.items


_TORCH_DTYPES: dict[np.dtype[Any], torch.dtype] = {}


def _torch_dtype(dtype: np.dtype[Any]) -> torch.dtype:
    found = _TORCH_DTYPES.get(dtype)
    if found is None:
        found = torch.from_numpy(np.empty(0, dtype=dtype)).dtype
        _TORCH_DTYPES[dtype] = found
    return found


# One entry per output value: (key, dtype, shape, byte offset) for packed arrays;
# (key, None, None, _Strings) for string/binary columns packed as Arrow buffers; or
# (key, None, None, python object).
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
    start = array.offset
    offsets = np.frombuffer(offsets_buffer, dtype=np.int32)[start : start + len(array) + 1]
    if data is None or not len(array):
        return np.zeros(len(array) + 1, np.int32), np.empty(0, np.uint8)
    first, last = int(offsets[0]), int(offsets[-1])
    return offsets - offsets[0], np.frombuffer(data, dtype=np.uint8)[first:last]


class PackedBundle:
    """Consecutive torch batches of one worker, their numeric data in one shared buffer."""

    __slots__ = ("buffer", "layouts")

    def __init__(self, buffer: torch.Tensor, layouts: list[list[_Entry]]) -> None:
        self.buffer = buffer
        self.layouts = layouts

    def pin_memory(self) -> PackedBundle:
        """Pin the one buffer (called by the DataLoader's pin-memory thread)."""
        return PackedBundle(self.buffer.pin_memory(), self.layouts)

    def unpack(self) -> list[dict[str, Any]]:
        """The batches, as dicts of views into the buffer."""
        buffer = self.buffer
        raw = buffer.numpy()
        batches = []
        for layout in self.layouts:
            batch: dict[str, Any] = {}
            for key, dtype, shape, where in layout:
                if dtype is None or shape is None:
                    batch[key] = where.to_pylist(raw) if isinstance(where, _Strings) else where
                else:
                    nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
                    view = buffer[where : where + nbytes].view(_torch_dtype(dtype))
                    batch[key] = view.view(shape)
            batches.append(batch)
        return batches


def _shared_buffer(nbytes: int) -> torch.Tensor:
    # Allocating straight into shared memory saves the copy DataLoader's pickler would make.
    storage = torch.UntypedStorage._new_shared(max(nbytes, 1))  # type: ignore[no-untyped-call]
    return torch.empty(0, dtype=torch.uint8).set_(storage)[:nbytes]


def pack(batches: Sequence[list[Field]]) -> PackedBundle:
    """Pack the fields of several batches into one shared buffer.

    Gathers (shuffled rows) are done straight into the buffer: one copy per value.
    """
    layouts: list[list[_Entry]] = []
    sources: list[tuple[int, np.dtype[Any], tuple[int, ...], Field]] = []
    copies: list[tuple[int, np.ndarray]] = []
    offset = 0
    for fields in batches:
        layout: list[_Entry] = []
        for field in fields:
            if field.shape is None:
                parts = _string_parts(field.data) if isinstance(field.data, pa.Array) else None
                if parts is None:
                    data = field.data
                    layout.append((field.key, None, None, _pylist(data)))
                    continue
                offsets, values = parts
                rows = len(offsets) - 1
                strings = _Strings(_arrow_type(field), rows, offset, 0, len(values))
                copies.append((offset, offsets))
                offset += -(-offsets.nbytes // _ALIGN) * _ALIGN
                strings.values_at = offset
                copies.append((offset, values))
                offset += -(-values.nbytes // _ALIGN) * _ALIGN
                layout.append((field.key, None, None, strings))
                continue
            dtype = _dtype_of(field)
            layout.append((field.key, dtype, field.shape, offset))
            sources.append((offset, dtype, field.shape, field))
            nbytes = int(np.prod(field.shape, dtype=np.int64)) * dtype.itemsize
            offset += -(-nbytes // _ALIGN) * _ALIGN
        layouts.append(layout)
    buffer = _shared_buffer(offset)
    target = buffer.numpy()
    for where, array in copies:
        target[where : where + array.nbytes] = array.view(np.uint8)
    for where, dtype, shape, field in sources:
        nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
        if not nbytes:
            continue
        out = target[where : where + nbytes].view(dtype).reshape(shape)
        if isinstance(field.data, Gather):
            np.take(field.data.source, field.data.rows, axis=0, out=out)
        else:
            out[...] = as_numpy(field)
    return PackedBundle(buffer, layouts)


def _arrow_type(field: Field) -> pa.DataType:
    assert isinstance(field.data, pa.Array)  # checked by the caller
    return field.data.type


def _pylist(data: Any) -> Any:
    return data.to_pylist() if isinstance(data, pa.Array) else data


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


def unbundle(items: Iterator[Any]) -> Iterator[Any]:
    """Yield the batches inside bundles (anything else passes through)."""
    for item in items:
        if isinstance(item, PackedBundle | Bundle):
            yield from item.unpack()
        else:
            yield item
