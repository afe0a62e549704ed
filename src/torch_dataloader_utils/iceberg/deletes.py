"""Positional deletes: reading delete files, and the arithmetic of live rows.

A position-delete file lists ``(file_path, pos)`` pairs: row ``pos`` (a 0-based ordinal over the
whole data file) of ``file_path`` is deleted. A chunk covers a range of row groups, so its
deleted rows are the positions inside the chunk's physical rows, shifted by the chunk's first
row. Chunks count LIVE rows (rows left after the deletes): ``read(chunk, a, b)`` addresses live
rows ``[a, b)``, which `physical_range` maps to the physical rows to decode and `keep_mask`
thins, batch by batch. Everything is a sorted ``int64`` array and ``searchsorted``: exact and
deterministic.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from ..formats.opening import open_input, parsing
from ..fs import FileSystemSpec

__all__ = [
    "DeletePositions",
    "deleted_in",
    "keep_mask",
    "live_rows",
    "merge_positions",
    "physical_range",
    "read_position_deletes",
]

# Position-delete files: the spec's column names (field ids 2147483546 and 2147483545).
FILE_PATH = "file_path"
POS = "pos"

DeletePositions = dict[str, np.ndarray]  # data file path (as written) -> positions


def read_position_deletes(path: str, fs: FileSystemSpec) -> DeletePositions:
    """The positions a position-delete Parquet file deletes, per data file it names.

    Args:
        path: the delete file, without protocol.
        fs: its filesystem.

    Returns:
        Data file paths, as the delete file writes them, to their positions (unsorted).

    Raises:
        StorageError: the file cannot be read.
        CorruptFileError: the file is not a Parquet position-delete file.
    """
    url = fs.url(path)
    kind = (
        f"a readable Iceberg position-delete file (Parquet with columns {FILE_PATH!r} and {POS!r})"
    )

    def read() -> pa.Table:
        with open_input(path, fs) as source, parsing(url, kind):
            return pq.read_table(source, columns=[FILE_PATH, POS], use_threads=False)

    table = fs.request(read, what=url)
    table = table.drop_null()
    if not table.num_rows:
        return {}
    encoded = pc.dictionary_encode(table.column(FILE_PATH).combine_chunks())
    codes = encoded.indices.to_numpy(zero_copy_only=False)
    names = encoded.dictionary.to_pylist()
    positions = table.column(POS).combine_chunks().to_numpy(zero_copy_only=False)
    order = np.argsort(codes, kind="stable")
    bounds = np.searchsorted(codes[order], np.arange(len(names) + 1))
    return {
        str(name): positions[order[bounds[k] : bounds[k + 1]]].astype(np.int64, copy=False)
        for k, name in enumerate(names)
    }


def merge_positions(delete_files: Iterable[Mapping[str, np.ndarray]], data_file: str) -> np.ndarray:
    """The sorted, unique positions of ``data_file`` (as manifests name it) that any of
    ``delete_files`` deletes."""
    parts = [d[data_file] for d in delete_files if data_file in d]
    if not parts:
        return np.empty(0, dtype=np.int64)
    return np.unique(np.concatenate(parts).astype(np.int64, copy=False))


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
