"""Array helpers of list columns: a fixed-size list's values, rows padded to the longest."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa

from .arrow_values import arrow_of, valid_view

__all__ = ["ListRows", "fixed_values", "gather_rows", "pad_rows"]

# List rows of _SLICE_MEAN values or more on average are copied a slice each, shorter ones in one
# vectorised gather; padded rows wider than _STRIDED_WIDTH a row at a time, narrower ones through
# one strided view: whichever was faster
# (docs/adr/0020-measurements-behind-constants.md#converting-rows).
_SLICE_MEAN = 100
_STRIDED_WIDTH = 192


def fixed_values(array: pa.Array, size: int) -> pa.Array:
    """The values of a fixed-size list array, a null row's as nulls (to be filled)."""
    values = array.flatten()  # skips null rows' values
    if len(values) == len(array) * size:
        return values
    row_valid = valid_view(array)
    positions = np.full(len(array) * size, -1, dtype=np.int64)
    positions[np.repeat(row_valid, size)] = np.arange(len(values))
    return values.take(arrow_of(positions, valid=positions >= 0))


@dataclass(frozen=True, slots=True)
class ListRows:
    """Each row's list, ``values[start:start + length]``, laid end to end (``pad`` None) or
    padded to the longest with ``pad``: not copied yet, so that it can be copied straight
    into its destination (a packed transport buffer) like a `Gather`."""

    values: np.ndarray
    starts: np.ndarray
    lengths: np.ndarray
    pad: Any = None

    @property
    def dtype(self) -> np.dtype[Any]:
        return np.dtype(self.values.dtype)

    def shape(self) -> tuple[int, ...]:
        if self.pad is None:
            return (int(self.lengths.sum()),)
        return (len(self.lengths), int(self.lengths.max()) if len(self.lengths) else 0)

    def into(self, out: np.ndarray) -> None:
        if self.pad is None:
            gather_rows(self.values, self.starts, self.lengths, out=out)
        else:
            pad_rows(self.values, self.starts, self.lengths, self.pad, out=out)


def gather_rows(
    values: np.ndarray, starts: np.ndarray, lengths: np.ndarray, out: np.ndarray | None = None
) -> np.ndarray:
    """Each row's list, ``values[start:start + length]``, laid end to end (into ``out``)."""
    n = len(starts)
    total = int(lengths.sum())
    if out is None:
        out = np.empty(total, dtype=values.dtype)
    if n and total >= _SLICE_MEAN * n:
        spans = zip(starts.tolist(), (starts + lengths).tolist(), strict=True)
        np.concatenate([values[a:b] for a, b in spans], out=out)
        return out
    begins = np.zeros(n, dtype=np.int64)
    np.cumsum(lengths[:-1], out=begins[1:])
    values.take(np.repeat(starts - begins, lengths) + np.arange(total), out=out)
    return out


def pad_rows(
    values: np.ndarray,
    starts: np.ndarray,
    lengths: np.ndarray,
    pad: Any,
    out: np.ndarray | None = None,
) -> np.ndarray:
    """Each row's list, ``values[start:start + length]``, padded to the longest with ``pad``
    (into ``out``, as wide as the longest: `ListRows.shape`)."""
    n = len(starts)
    # (Into `out`: its width is the longest, found already for its shape.)
    longest = out.shape[1] if out is not None else int(lengths.max()) if n else 0
    if longest > _STRIDED_WIDTH:
        if out is None:
            wide = np.zeros((n, longest), dtype=values.dtype)  # (zeroed pages come cheap)
            if pad != 0:
                wide.fill(pad)
        else:
            wide = out
            wide.fill(pad)  # (a memset: cheaper than filling each row's tail from Python)
        for row, (a, m) in enumerate(zip(starts.tolist(), lengths.tolist(), strict=True)):
            wide[row, :m] = values[a : a + m]
        return wide
    if not longest:
        return np.empty((n, 0), dtype=values.dtype) if out is None else out
    if len(values) >= longest and int(starts.max()) <= len(values) - longest:
        # Each row's list as one row of `longest` values of a strided view: a row-wise memcpy
        # beats an element-wise gather
        # (docs/adr/0020-measurements-behind-constants.md#converting-rows). Fancy indexing
        # reads the view in place into a new array; np.take would first copy the whole
        # overlapping view (len(values) x longest elements).
        rows: np.ndarray = _windows(values, longest)[starts]
        if out is None:
            padded = rows
        else:
            padded = out
            padded[...] = rows
    else:  # (a list too near the end for a full view row: those rows one at a time)
        padded = np.empty((n, longest), dtype=values.dtype) if out is None else out
        whole = starts <= len(values) - longest
        if len(values) >= longest:
            padded[whole] = _windows(values, longest)[starts[whole]]
        for i in np.flatnonzero(~whole):
            padded[i, : lengths[i]] = values[starts[i] : starts[i] + lengths[i]]
    # Each row's tail padded through a mask made as the values were: rows of a strided view
    # (a broadcast compare and a masked assignment took twice as long:
    # docs/benchmarks.md#small-batches-list-columns). Cast as an assignment casts: a pad of
    # 0.0 pads an integer column (the value was checked to fit, `columns._check_pad_value`).
    np.copyto(padded, pad, casting="unsafe", where=_tails(lengths, longest))
    return padded


# Falses then Trues, _STRIDED_WIDTH each: row s of its width-w windows is (_STRIDED_WIDTH - s)
# Falses then Trues (`_tails`).
_FALSES_TRUES = np.repeat([False, True], _STRIDED_WIDTH)
_FALSES_TRUES.flags.writeable = False


def _tails(lengths: np.ndarray, width: int) -> np.ndarray:
    """Where each row of ``width`` values is padding: ``lengths[r]`` Falses, then Trues (every
    length at most ``width``, at most `_STRIDED_WIDTH`)."""
    view: np.ndarray = np.ndarray((_STRIDED_WIDTH + 1, width), np.bool_, _FALSES_TRUES, 0, (1, 1))
    view.flags.writeable = False
    mask: np.ndarray = view[_STRIDED_WIDTH - lengths]
    return mask


def _windows(values: np.ndarray, width: int) -> np.ndarray:
    """Every run of ``width`` values of ``values`` (1-D), as rows of a read-only strided view:
    numpy's ``sliding_window_view`` builds the same view in 10 µs a call, this in 0.5 for
    contiguous values (a batch of 32 rows with a list column takes about 190 µs in all,
    `benchmarks/mixing.py`)."""
    step = values.strides[0]
    shape = (len(values) - width + 1, width)
    if not values.flags.c_contiguous:
        return np.lib.stride_tricks.as_strided(values, shape, (step, step), writeable=False)
    view: np.ndarray = np.ndarray(shape, values.dtype, values, 0, (step, step))
    view.flags.writeable = False
    return view
