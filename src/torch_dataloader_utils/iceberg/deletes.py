"""Iceberg's position-delete files: reading them, and merging their positions per data file.

A position-delete file lists ``(file_path, pos)`` pairs: row ``pos`` (a 0-based ordinal over the
whole data file) of ``file_path`` is deleted. What a table does with deleted positions (live
rows per row group, live rows back to physical ones) is every table kind's, in
`sources.table_deletes`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from ..formats.opening import open_input, parsing
from ..fs import FileSystemSpec

__all__ = ["DeletePositions", "merge_positions", "read_position_deletes"]

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
