"""Arrow values of any type: taking rows of them, and what they become as Python objects.

`take` is every row gather of the library (blocks, batches, shuffles) for types pyarrow's own
kernel lacks; `python_type`/`as_plain` say what a column that becomes Python objects goes
through; the rest are the per-batch checks the reader runs where the file is known (strings
that are not UTF-8, dates outside Python's range). docs/reference/types.md is the table.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

__all__ = [
    "Picks",
    "arrow_of",
    "as_plain",
    "bool_view",
    "filled_values",
    "list_lengths",
    "holds_interval",
    "null_marked",
    "intervals",
    "numpy_view",
    "outside_python",
    "python_type",
    "string_arrays",
    "take",
    "temporal_int",
    "valid_view",
]


def numpy_view(array: pa.Array) -> np.ndarray:
    """``array.to_numpy(zero_copy_only=True)``, for a null-free integer or float array read
    straight from its buffer: pyarrow's own conversion loads pandas on its first call, 0.25 s
    of a spawned worker's first batch (docs/adr/0016-main-process-share.md#spawned-workers)."""
    t = array.type
    if array.null_count or not (pa.types.is_integer(t) or pa.types.is_floating(t)):
        converted: np.ndarray = array.to_numpy(zero_copy_only=True)
        return converted
    dtype = np.dtype(t.to_pandas_dtype())
    if not len(array):
        return np.empty(0, dtype)
    view = np.frombuffer(array.buffers()[1], dtype, len(array), array.offset * dtype.itemsize)
    view.flags.writeable = False  # (Arrow memory, as to_numpy gives it)
    return view


# pyarrow's own conversions from and to numpy (``pa.array``, ``to_numpy``, ``np.asarray``) load
# pandas on their first call, when it is installed: 0.1-0.25 s of a process's first batch
# (docs/adr/0016-main-process-share.md#spawned-workers). The read path uses these instead.


def arrow_of(values: np.ndarray, valid: np.ndarray | None = None) -> pa.Array:
    """``pa.array(values, mask=~valid)`` of a 1-d integer or float array, zero-copy."""
    values = np.ascontiguousarray(values)
    bitmap = None if valid is None else pa.py_buffer(np.packbits(valid, bitorder="little"))
    nulls = -1 if valid is not None else 0
    return pa.Array.from_buffers(
        pa.from_numpy_dtype(values.dtype), len(values), [bitmap, pa.py_buffer(values)], nulls
    )


def filled_values(array: pa.Array, fill: int = 0) -> np.ndarray:
    """A null-free integer or float array's `numpy_view`; with nulls, a copy of its values with
    each null as ``fill``."""
    if not array.null_count:
        return numpy_view(array)
    dtype = np.dtype(array.type.to_pandas_dtype())
    start = array.offset * dtype.itemsize
    out = np.frombuffer(array.buffers()[1], dtype, len(array), start).copy()
    out[~valid_view(array)] = fill
    return out


def list_lengths(column: pa.Array | pa.ChunkedArray) -> np.ndarray:
    """Each list's length in ``column`` (a null list: 0), as int64."""
    lengths = pc.list_value_length(column)
    chunks = lengths.chunks if isinstance(lengths, pa.ChunkedArray) else [lengths]
    parts = [filled_values(c).astype(np.int64) for c in chunks]
    return np.concatenate(parts) if parts else np.zeros(0, np.int64)


def null_marked(column: pa.Array | pa.ChunkedArray) -> np.ndarray:
    """Each list's length in ``column`` as int32, a null list's -1 (a length index tells a null
    list from an empty one: an ``eos_token`` follows the empty one only)."""
    lengths = list_lengths(column).astype(np.int32)
    if column.null_count:
        chunks = column.chunks if isinstance(column, pa.ChunkedArray) else [column]
        valid = np.concatenate([valid_view(c) for c in chunks])
        lengths[~valid] = -1
    return lengths


def bool_view(array: pa.Array) -> np.ndarray:
    """``array.to_numpy(zero_copy_only=False)`` of a null-free boolean array."""
    return _bits(array.buffers()[1], array.offset, len(array))


def valid_view(array: pa.Array) -> np.ndarray:
    """``array.is_valid().to_numpy(zero_copy_only=False)``."""
    n = len(array)
    if not array.null_count:
        return np.ones(n, np.bool_)
    bitmap = array.buffers()[0] if array.type.num_buffers and array.type != pa.null() else None
    if bitmap is None or pa.types.is_union(array.type) or pa.types.is_run_end_encoded(array.type):
        return np.asarray(array.is_valid(), np.bool_)  # (no validity bitmap of its own)
    return _bits(bitmap, array.offset, n)


def _bits(buffer: pa.Buffer, offset: int, n: int) -> np.ndarray:
    if not n:
        return np.zeros(0, np.bool_)
    bits = np.frombuffer(buffer, np.uint8)
    return np.unpackbits(bits, count=offset + n, bitorder="little")[offset:].view(np.bool_)


def temporal_int(t: pa.DataType) -> pa.DataType | None:
    """The integer type a temporal type is stored as (None: not temporal)."""
    if pa.types.is_date32(t) or pa.types.is_time32(t):
        return pa.int32()
    if (
        pa.types.is_timestamp(t)
        or pa.types.is_date64(t)
        or pa.types.is_time64(t)
        or pa.types.is_duration(t)
    ):
        return pa.int64()
    return None


def take(data: Any, rows: np.ndarray | None) -> Any:
    """Rows ``rows`` of an array or record batch (``None``: all). Types pyarrow's ``take``
    has no kernel for (views, run-end encoded) are taken through their plain form and
    converted back, so shuffling them keeps their type.

    A table (a shuffle block left in parts) gives a record batch, a chunked array an array,
    taken from each chunk: pyarrow's own ``take`` of a chunked array first joins its chunks, up
    to 15x slower (docs/adr/0015-copies-removed.md)."""
    if rows is None:
        return data
    if isinstance(data, pa.Table | pa.ChunkedArray):
        return _take_chunked(data, rows)
    indices = arrow_of(np.asarray(rows, np.int64))
    try:
        return data.take(indices)
    except pa.ArrowNotImplementedError:
        if isinstance(data, pa.RecordBatch):
            columns = [take(c, rows) for c in data.columns]
            return pa.RecordBatch.from_arrays(columns, schema=data.schema)
        plain = python_type(data.type, keep_temporal=True)
        if plain == data.type:
            raise
        taken = as_plain(data, plain).take(indices)
        if pa.types.is_run_end_encoded(data.type):
            return pc.run_end_encode(taken, run_end_type=data.type.run_end_type)
        return taken.cast(data.type)


class Picks:
    """Where rows lie among the consecutive parts of something chunked (a shuffle block left
    in parts, a chunked array): for each part, the output positions it fills and its own rows
    that fill them (in output order)."""

    __slots__ = ("parts",)

    def __init__(self, starts: np.ndarray, rows: np.ndarray) -> None:
        """``starts``: the first row of each part; ``rows``: the rows to output."""
        part = np.searchsorted(starts, rows, side="right") - 1
        order = np.argsort(part, kind="stable")
        bounds = np.searchsorted(part[order], np.arange(len(starts) + 1)).tolist()
        self.parts: list[tuple[np.ndarray, np.ndarray]] = []
        for k, start in enumerate(starts.tolist()):
            positions = order[bounds[k] : bounds[k + 1]]
            self.parts.append((positions, rows[positions] - start))


def _take_chunked(data: pa.Table | pa.ChunkedArray, rows: np.ndarray) -> Any:
    """Rows of a table (as a record batch) or chunked array (as an array), each chunk's taken
    from it, joined, then put in order."""
    chunks = data.to_batches() if isinstance(data, pa.Table) else data.chunks
    if len(chunks) == 1:
        return take(chunks[0], rows)
    if not chunks:  # (so no rows either)
        if isinstance(data, pa.Table):
            schema = data.schema
            return pa.RecordBatch.from_arrays([pa.array([], f.type) for f in schema], schema=schema)
        return pa.array([], data.type)
    starts = np.cumsum([0] + [len(c) for c in chunks[:-1]])
    picks = Picks(starts, np.asarray(rows, np.int64))
    taken = [(p, take(c, r)) for c, (p, r) in zip(chunks, picks.parts, strict=True) if len(p)]
    if not taken:
        joined = chunks[0].slice(0, 0)
    elif isinstance(data, pa.Table):
        joined = pa.concat_batches([got for _, got in taken])
    else:
        joined = pa.concat_arrays([got for _, got in taken])
    order = np.concatenate([p for p, _ in taken]) if taken else np.arange(0)
    where = np.empty(len(rows), np.int64)
    where[order] = np.arange(len(rows))  # output row i is row where[i] of the rows joined
    return take(joined, where)


def python_type(t: pa.DataType, *, keep_temporal: bool = False) -> pa.DataType:
    """The type values of ``t`` become Python objects through: views as their plain types,
    run-end encoded as their values, extension types as their storage, and (unless
    ``keep_temporal``) temporal values as their stored integers, at any depth."""
    if isinstance(t, pa.BaseExtensionType):  # pyarrow's own Python values (uuid.UUID, ...)
        storage = python_type(t.storage_type, keep_temporal=keep_temporal)
        return t if storage == t.storage_type else storage
    if pa.types.is_run_end_encoded(t):
        return python_type(t.value_type, keep_temporal=keep_temporal)
    if pa.types.is_string_view(t):
        return pa.large_string()
    if pa.types.is_binary_view(t):
        return pa.large_binary()
    if not keep_temporal:
        as_int = temporal_int(t)
        if as_int is not None:
            return as_int
    inner = functools.partial(python_type, keep_temporal=keep_temporal)
    if pa.types.is_struct(t):
        return pa.struct([f.with_type(inner(f.type)) for f in t])
    if pa.types.is_map(t):
        return pa.map_(
            t.key_field.with_type(inner(t.key_type)), t.item_field.with_type(inner(t.item_type))
        )
    # List views stay as they are, and to_pylist reads them directly: pyarrow 26's cast of a
    # list view to a list loses values
    # (docs/adr/0020-measurements-behind-constants.md#converting-rows).
    if pa.types.is_list(t):
        return pa.list_(t.value_field.with_type(inner(t.value_type)))
    if pa.types.is_large_list(t):
        return pa.large_list(t.value_field.with_type(inner(t.value_type)))
    if pa.types.is_fixed_size_list(t):
        return pa.list_(t.value_field.with_type(inner(t.value_type)), t.list_size)
    if pa.types.is_dictionary(t):
        return inner(t.value_type)
    return t


def as_plain(array: pa.Array, plain: pa.DataType) -> pa.Array:
    """``array`` as type ``plain`` (from `python_type`)."""
    if array.type == plain:
        return array
    if isinstance(array.type, pa.BaseExtensionType):
        array = array.storage
    if pa.types.is_run_end_encoded(array.type):
        array = pc.run_end_decode(array)
    if pa.types.is_dictionary(array.type):
        array = array.dictionary_decode()
    if array.type == plain:
        return array
    try:
        return array.cast(plain)
    except (pa.ArrowNotImplementedError, pa.ArrowInvalid):
        # Temporal to integer inside nested types: same layout, so a view.
        return array.view(plain)


def intervals(array: pa.Array) -> list[Any]:
    """month_day_nano intervals as ``{"months", "days", "nanoseconds"}`` dicts (pyarrow's
    MonthDayNano objects cannot be pickled to the main process)."""
    return [
        None if v is None else {"months": v.months, "days": v.days, "nanoseconds": v.nanoseconds}
        for v in array.to_pylist()
    ]


def holds_interval(t: pa.DataType) -> bool:
    if pa.types.is_interval(t):
        return True
    if pa.types.is_dictionary(t):
        return holds_interval(t.value_type)
    if isinstance(t, pa.BaseExtensionType):
        return holds_interval(t.storage_type)
    return any(holds_interval(t.field(i).type) for i in range(t.num_fields))


def string_arrays(array: pa.Array) -> Iterator[pa.Array]:
    """The string arrays in ``array`` (itself, or inside structs, lists, maps, dictionaries)."""
    t = array.type
    if pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_string_view(t):
        yield array
    elif pa.types.is_dictionary(t):
        yield from string_arrays(array.dictionary)
    elif pa.types.is_struct(t):
        for i in range(t.num_fields):
            yield from string_arrays(array.field(i))
    elif pa.types.is_map(t):
        yield from string_arrays(array.keys)
        yield from string_arrays(array.items)
    elif (
        pa.types.is_list(t)
        or pa.types.is_large_list(t)
        or pa.types.is_fixed_size_list(t)
        or pa.types.is_list_view(t)
        or pa.types.is_large_list_view(t)
    ):
        yield from string_arrays(array.values)


# Python's datetime range, in days since the epoch (date.min and date.max).
_DAYS = (-719_162, 2_932_896)
_PER_DAY = {"s": 86_400, "ms": 86_400_000, "us": 86_400_000_000, "ns": 86_400_000_000_000}


def outside_python(name: str, column: pa.Array) -> str | None:
    """Why a timestamp or date column cannot become Python ``datetime``/``date``, or None."""
    t = column.type
    if column.null_count == len(column):
        return None
    if pa.types.is_timestamp(t):
        ticks = _PER_DAY[t.unit]
        values = pc.min_max(column.view(pa.int64()))
    elif pa.types.is_date64(t):
        ticks = _PER_DAY["ms"]
        values = pc.min_max(column.view(pa.int64()))
    else:
        ticks = 1
        values = pc.min_max(column.view(pa.int32()))
    low, high = values["min"].as_py(), values["max"].as_py()
    # A day's margin: a time zone may move a value by up to a day.
    if low < (_DAYS[0] + 1) * ticks or high > (_DAYS[1] - 1) * ticks:
        return (
            f"column {name!r} ({t}) holds values outside Python's datetime range (years "
            '1-9999); read it with output_format="torch", "numpy" or "arrow" (stored integers)'
        )
    return None
