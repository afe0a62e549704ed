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

import numpy as np

__all__ = ["deleted_in", "keep_mask", "live_positions", "live_rows", "physical_range"]


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
