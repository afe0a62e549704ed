"""Iceberg's position deletes: position-delete files and deletion vectors, read, and their
positions merged per data file.

A position-delete file lists ``(file_path, pos)`` pairs: row ``pos`` (a 0-based ordinal over the
whole data file) of ``file_path`` is deleted. A deletion vector (format version 3) is a
``deletion-vector-v1`` blob of a Puffin file: the deleted positions of the one data file it
references, as a roaring bitmap (decoded by `sources.deletion_vectors`, shared with Delta). What
a table does with deleted positions (live rows per row group, live rows back to physical ones)
is every table kind's, in `sources.table_deletes`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from ..errors import CorruptFileError
from ..formats.opening import open_input, parsing, read_range
from ..fs import FileSystemSpec
from ..sources.deletion_vectors import puffin_dv_positions

__all__ = [
    "DeletePositions",
    "DeletionVector",
    "merge_positions",
    "read_deletes",
    "read_deletion_vector",
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


@dataclass(frozen=True)
class DeletionVector:
    """A deletion vector: one ``deletion-vector-v1`` blob of a Puffin file, as the table's
    manifest entry for it locates it.

    Attributes:
        path: the Puffin file, without protocol.
        offset: where the blob starts in it (the entry's ``content_offset``).
        size: the blob's bytes (``content_size_in_bytes``).
        data_file: the data file whose rows it deletes, as manifests name it
            (``referenced_data_file``).
        cardinality: the positions it deletes (the entry's ``record_count``).
    """

    path: str
    offset: int
    size: int
    data_file: str
    cardinality: int


def read_deletion_vector(vector: DeletionVector, fs: FileSystemSpec) -> DeletePositions:
    """The positions a deletion vector deletes: its blob's bytes read (nothing else of the
    Puffin file), and decoded.

    Args:
        vector: the vector.
        fs: the filesystem of its Puffin file.

    Returns:
        The data file it references to its sorted positions.

    Raises:
        StorageError: the Puffin file cannot be read.
        CorruptFileError: the blob is not a deletion vector (bad size, magic, CRC-32 or bitmap),
            or deletes other than ``cardinality`` positions; the message names the Puffin file
            and the data file.
    """
    where = (
        f"deletion vector at bytes {vector.offset}-{vector.offset + vector.size - 1} of Puffin "
        f"file {fs.url(vector.path)} (of data file {vector.data_file})"
    )
    blob = read_range(vector.path, vector.offset, vector.size, fs)
    positions = puffin_dv_positions(blob, where)
    if len(positions) != vector.cardinality:
        raise CorruptFileError(
            f"{where}: {len(positions)} deleted rows, the table's manifest says "
            f"{vector.cardinality}: the file was changed or replaced after it was committed"
        )
    return {vector.data_file: positions}


def read_deletes(delete: str | DeletionVector, fs: FileSystemSpec) -> DeletePositions:
    """The positions a position-delete file (its path) or a deletion vector deletes, per data
    file (`read_position_deletes`, `read_deletion_vector`)."""
    if isinstance(delete, DeletionVector):
        return read_deletion_vector(delete, fs)
    return read_position_deletes(delete, fs)


def merge_positions(delete_files: Iterable[Mapping[str, np.ndarray]], data_file: str) -> np.ndarray:
    """The sorted, unique positions of ``data_file`` (as manifests name it) that any of
    ``delete_files`` deletes."""
    parts = [d[data_file] for d in delete_files if data_file in d]
    if not parts:
        return np.empty(0, dtype=np.int64)
    return np.unique(np.concatenate(parts).astype(np.int64, copy=False))
