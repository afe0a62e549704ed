"""How one value of a packed batch lies in the buffer (`wire.pack`): arrays by dtype and shape
(`_dtype_of`, `_nbytes`), string/binary columns as Arrow offsets and bytes (`_Strings`), any
other Python values pickled in the worker (`_Pickled`), or, a plain number, as it is
(`_python_value`).
"""

from __future__ import annotations

import pickle
from typing import Any

import numpy as np
import pyarrow as pa
import torch

from ..convert import IN_PLACE, Field, Gather
from ..errors import DataError

_TORCH_DTYPES: dict[np.dtype[Any], torch.dtype] = {}


def _torch_dtype(dtype: np.dtype[Any]) -> torch.dtype:
    found = _TORCH_DTYPES.get(dtype)
    if found is None:
        found = torch.from_numpy(np.empty(0, dtype=dtype)).dtype
        _TORCH_DTYPES[dtype] = found
    return found


# One entry per output value: (key, dtype, shape, byte offset) for packed arrays;
# (key, None, None, _Strings) for string/binary columns packed as Arrow buffers; or
# (key, None, None, _Pickled) for Python values, pickled in the worker; or (key, None, None,
# value) for a plain number (a packed batch's ``max_seqlen``).
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
        strings: list[Any] = array.to_pylist()  # (a new list already: no copy of it)
        return strings


def _string_arrays(array: pa.Array) -> tuple[np.ndarray, np.ndarray] | None:
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


def _nbytes(shape: tuple[int, ...], dtype: np.dtype[Any]) -> int:
    count = 1
    for n in shape:
        count *= n
    return count * dtype.itemsize


def _arrow_type(field: Field) -> pa.DataType:
    assert isinstance(field.data, pa.Array)  # checked by the caller
    return field.data.type


def _pylist(data: Any) -> Any:
    return data.to_pylist() if isinstance(data, pa.Array) else data


class _Pickled:
    """A column's Python values, pickled in the worker's own thread, where a failure can be
    raised (as `wire.Bundle.seal` explains). Pickled once either way."""

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


# Values that travel in a message as they are: pickling them cannot fail, and a blob of their
# own cost ~1 µs a batch in the worker and the main process (a packed batch's ``max_seqlen``).
_PLAIN = (int, float, bool)


def _python_value(key: str, data: Any) -> Any:
    """What an entry holds for a Python value: a plain number itself, else `_Pickled`."""
    return data if type(data) in _PLAIN else _Pickled.of(key, data)


def _loaded(where: Any) -> Any:
    """The value an entry's `_python_value` holds."""
    return where.load() if isinstance(where, _Pickled) else where


def _dtype_of(field: Field) -> np.dtype[Any]:
    data = field.data
    if isinstance(data, np.ndarray):  # (the commonest first: a few calls a field a batch)
        return data.dtype
    if isinstance(data, IN_PLACE):
        return data.dtype
    if isinstance(data, Gather):
        return np.dtype(data.array.dtype)
    if isinstance(data, pa.Array):
        dtype: np.dtype[Any] = np.dtype(data.type.to_pandas_dtype())
        return dtype
    raise TypeError(f"field {field.key!r} holds {type(data).__name__}, not an array")
