"""Array helpers of list columns: a fixed-size list's values, rows padded to the longest, rows
gathered from the parts of a block without joining them (`ListParts`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa

from .arrow_values import arrow_of, valid_view

__all__ = ["ListParts", "ListRows", "fixed_values", "gather_rows", "list_parts", "pad_rows"]

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


@dataclass(frozen=True, slots=True)
class ListParts:
    """`ListRows` of a shuffle block left in parts (`convert.parts`), gathered from the parts'
    own values: row ``i``'s list is ``parts[part[i]][starts[i]:starts[i] + lengths[i]]``.
    Joining the parts' values first copied the whole block's lists once more per block, on
    the thread that converts (docs/benchmarks.md#list-rows-gathered-from-a-blocks-parts).

    Attributes:
        parts: each part's values (1-D).
        part: each output row's part.
        starts, lengths: each output row's list in its part's values.
        positions: each part's output rows (`Picks`).
        pad: as `ListRows`'s.
    """

    parts: tuple[np.ndarray, ...]
    part: np.ndarray
    starts: np.ndarray
    lengths: np.ndarray
    positions: tuple[np.ndarray, ...]
    pad: Any = None

    @property
    def dtype(self) -> np.dtype[Any]:
        return np.dtype(self.parts[0].dtype)

    def shape(self) -> tuple[int, ...]:
        return ListRows(self.parts[0], self.starts, self.lengths, self.pad).shape()

    def into(self, out: np.ndarray) -> None:
        n = len(self.starts)
        if not n or not out.size:
            if self.pad is not None:
                out.fill(self.pad)
            return
        wide = self.pad is not None and out.shape[1] > _STRIDED_WIDTH
        if wide or (self.pad is None and out.size >= _SLICE_MEAN * n):
            # Long rows: a slice a row, each from its own part, in output order.
            rows = zip(self.part.tolist(), self.starts.tolist(), self.lengths.tolist(), strict=True)
            if self.pad is None:
                np.concatenate([self.parts[p][a : a + m] for p, a, m in rows], out=out)
                return
            out.fill(self.pad)
            for row, (p, a, m) in enumerate(rows):
                out[row, :m] = self.parts[p][a : a + m]
            return
        # Short rows: each part's rows gathered as `gather_rows` / `pad_rows` do, then put
        # in their output places.
        begins = np.zeros(n, dtype=np.int64)
        np.cumsum(self.lengths[:-1], out=begins[1:])
        for values, mine in zip(self.parts, self.positions, strict=True):
            if not len(mine):
                continue
            starts, lengths = self.starts[mine], self.lengths[mine]
            if self.pad is not None:
                out[mine] = pad_rows(values, starts, lengths, self.pad, out=out[mine])
                continue
            count = int(lengths.sum())
            inner = np.arange(count) - np.repeat(np.cumsum(lengths) - lengths, lengths)
            out[np.repeat(begins[mine], lengths) + inner] = values[
                np.repeat(starts, lengths) + inner
            ]


def list_parts(
    values: tuple[np.ndarray, ...],
    offsets: tuple[np.ndarray, ...],
    picks: list[tuple[np.ndarray, np.ndarray]],
    n: int,
    pad: Any = None,
) -> ListParts:
    """The `ListParts` of ``n`` output rows: ``picks``, each part's output positions and its
    own rows there (`Picks.parts`); ``values`` and ``offsets`` (int64), each part's."""
    part = np.zeros(n, dtype=np.intp)
    starts = np.zeros(n, dtype=np.int64)
    lengths = np.zeros(n, dtype=np.int64)
    for k, (positions, rows) in enumerate(picks):
        if len(positions):
            part[positions] = k
            first = offsets[k][rows]
            starts[positions] = first
            lengths[positions] = offsets[k][rows + 1] - first
    return ListParts(values, part, starts, lengths, tuple(p for p, _ in picks), pad)


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
