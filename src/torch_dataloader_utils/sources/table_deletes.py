"""The arithmetic of a table's deleted rows: positions, live rows, and live rows back to physical.

A table drops rows of its data files by position: row ``pos`` (a 0-based ordinal over the whole
data file) is deleted. Iceberg's position-delete files and Delta's deletion vectors both come
down to a sorted, unique ``int64`` array of such positions per data file. Chunks count LIVE
rows (rows left after the deletes): planning counts them per row group with `live_rows`, and a
table's `Format` maps the live rows ``[a, b)`` a reader asks for to the physical rows to decode
(`physical_range`) and thins each decoded batch (`keep_mask`). Everything is ``searchsorted``
on sorted arrays: exact and deterministic.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from ..planning import Chunk

__all__ = [
    "PhysicalRead",
    "chunk_file_rows",
    "deleted_in",
    "keep_mask",
    "live_positions",
    "live_rows",
    "physical_range",
    "physical_read",
]


def deleted_in(positions: np.ndarray, start: int, stop: int) -> np.ndarray:
    """The deleted positions inside physical rows ``[start, stop)``, relative to ``start``."""
    lo, hi = np.searchsorted(positions, [start, stop])
    return positions[lo:hi] - start


def live_rows(positions: np.ndarray, start: int, stop: int) -> int:
    """Rows of physical range ``[start, stop)`` that are not deleted."""
    lo, hi = np.searchsorted(positions, [start, stop])
    return int(stop - start - (hi - lo))


def physical_range(deleted: np.ndarray, row_start: int, row_stop: int) -> tuple[int, int]:
    """The physical rows to decode for live rows ``[row_start, row_stop)`` of a range whose
    deleted rows are ``deleted`` (sorted, unique, relative to the range).

    Live row ``k`` is physical row ``k + #{i : deleted[i] - i <= k}`` (``deleted[i] - i`` live
    rows precede the i-th deleted row). Deleted rows before the first live row asked for and
    after the last one are not decoded.
    """
    if row_start >= row_stop:
        return 0, 0
    before = deleted - np.arange(len(deleted), dtype=np.int64)
    first, last = np.searchsorted(before, [row_start, row_stop - 1], side="right")
    return int(row_start + first), int(row_stop - 1 + last + 1)


def keep_mask(deleted: np.ndarray, start: int, rows: int) -> np.ndarray | None:
    """Which of physical rows ``[start, start + rows)`` are live (``None``: all of them)."""
    lo, hi = np.searchsorted(deleted, [start, start + rows])
    if lo == hi:
        return None
    mask = np.ones(rows, dtype=bool)
    mask[deleted[lo:hi] - start] = False
    return mask


def live_positions(deleted: np.ndarray, start: int, stop: int) -> np.ndarray:
    """The physical rows of ``[start, stop)`` that are live, in order (``deleted``: sorted,
    unique, file-wide): live row ``k`` of the range is physical row ``out[k]``."""
    positions = np.arange(start, stop, dtype=np.int64)
    mask = keep_mask(deleted, start, stop - start)
    return positions if mask is None else positions[mask]


@dataclass(frozen=True)
class PhysicalRead:
    """What a table's format decodes for live rows of a chunk: the chunk as its data file's
    physical rows (a Parquet chunk), the physical rows ``[start, stop)`` of it to decode, and
    the chunk's deleted rows (relative to its first row), which each decoded batch drops."""

    chunk: Chunk
    start: int
    stop: int
    deleted: np.ndarray


def physical_read(
    chunk: Chunk, row_groups: Sequence[int], deleted: np.ndarray, row_start: int, row_stop: int
) -> PhysicalRead | None:
    """The `PhysicalRead` of live rows ``[row_start, row_stop)`` of ``chunk`` (row groups
    ``chunk.start:chunk.stop`` of a data file of ``row_groups`` physical rows, whose deleted
    positions are ``deleted``, file-wide); ``None``: no row to decode."""
    first = sum(row_groups[: chunk.start])
    physical_rows = tuple(row_groups[chunk.start : chunk.stop])
    total = sum(physical_rows)
    inside = deleted_in(deleted, first, first + total)
    start, stop = physical_range(inside, row_start, min(row_stop, chunk.num_rows))
    if start >= stop:
        return None
    physical = Chunk(
        path=chunk.path,
        start=chunk.start,
        stop=chunk.stop,
        num_rows=total,
        num_bytes=chunk.num_bytes,
        unit_rows=physical_rows,
    )
    return PhysicalRead(physical, start, stop, inside)


def chunk_file_rows(chunk: Chunk, row_groups: Sequence[int], deleted: np.ndarray) -> np.ndarray:
    """The row number in its data file of each of ``chunk``'s live rows (`Format.file_rows`)."""
    first = sum(row_groups[: chunk.start])
    return live_positions(deleted, first, first + sum(row_groups[chunk.start : chunk.stop]))
