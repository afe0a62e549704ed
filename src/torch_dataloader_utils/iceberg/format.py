"""The Iceberg `Format`: reads a plan's chunks (row-group ranges of Parquet data files), with
positional deletes applied and columns resolved by field id.

Decoding is ParquetFormat's: a chunk of an Iceberg plan is a Parquet chunk whose rows are the
live rows (after deletes). `read` maps the live rows asked for to the physical rows to decode,
reads them with ``ParquetFormat.read``, drops deleted rows batch by batch, and projects the
file's columns onto the table's schema. Planning is not done here: a table is planned from its
catalog and manifests (`plan_table`), not from a list of files.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from ..formats import ReadOptions
from ..formats.handles import HandleCache
from ..formats.parquet import ParquetFormat
from ..fs import FileSystemSpec, ListedFile
from ..planning import Chunk
from ..sources.table_deletes import PhysicalRead, chunk_file_rows, keep_mask, physical_read
from ..sources.tables import TableFormat
from .deletes import DeletePositions, DeletionVector, merge_positions, read_deletes
from .options import DataFileInfo, IcebergReadOptions
from .projection import (
    FileProjection,
    arrow_schema,
    parse_name_mapping,
    project,
    projected_schema,
    resolve_file,
)

__all__ = ["IcebergFormat"]

# Per worker: data files whose column matching is kept, delete files kept parsed, and data files
# whose merged deleted positions are kept. A stream reads chunks of a few files at a time.
_FILES = 64
_DELETE_FILES = 4
_DELETED = 8


@dataclass(frozen=True)
class _Physical:
    """A `PhysicalRead` of a chunk, and its data file's column matching."""

    read: PhysicalRead
    projection: FileProjection


class IcebergFormat(TableFormat[IcebergReadOptions]):
    """Parquet data files of an Iceberg table, read by field id with positional deletes.

    Stateless apart from per-process caches (dropped when pickled and on `close`).
    """

    name = "iceberg"
    options_type = IcebergReadOptions
    planned_from = "an Iceberg table is planned from its catalog"
    read_as = 'use IcebergDataset.create_dataloader(table="db.table", catalog_config={...})'

    def __init__(self) -> None:
        self._parquet = ParquetFormat()
        self._projections: HandleCache[str, FileProjection] = HandleCache(_FILES)
        self._delete_files: HandleCache[str, DeletePositions] = HandleCache(_DELETE_FILES)
        self._deleted: HandleCache[str, np.ndarray] = HandleCache(_DELETED)

    def __reduce__(self) -> tuple[type[IcebergFormat], tuple[()]]:
        return (type(self), ())  # caches stay behind: each process fills its own

    def schema(self, file: ListedFile, fs: FileSystemSpec) -> pa.Schema:
        """The physical schema of one data file (its own column names)."""
        return self._parquet.schema(file, fs)

    # --- per-process caches ----------------------------------------------------------------------

    def _projection(
        self, file: DataFileInfo, fs: FileSystemSpec, options: IcebergReadOptions
    ) -> FileProjection:
        def make() -> FileProjection:
            return resolve_file(
                self._parquet.schema(ListedFile(file.path, file.size, ""), fs),
                projected_schema(options.schema_json, options.columns),
                name_mapping=parse_name_mapping(options.name_mapping_json),
                format_version=options.format_version,
                constants=dict(file.constants),
                where=fs.url(file.path),
            )

        key = f"{file.path}\0{options.schema_json}\0{options.columns}"
        return self._projections.get(key, make)

    def deleted(self, file: DataFileInfo, fs: FileSystemSpec) -> np.ndarray:
        """The sorted positions of ``file`` that its delete files and deletion vector delete
        (file-wide ordinals)."""
        if not file.deletes:
            return np.empty(0, dtype=np.int64)

        def parsed(delete: str | DeletionVector) -> DeletePositions:
            if isinstance(delete, DeletionVector):
                return read_deletes(delete, fs)  # one data file's: its merged positions are kept
            return self._delete_files.get(delete, lambda: read_deletes(delete, fs))

        return self._deleted.get(
            file.path, lambda: merge_positions((parsed(d) for d in file.deletes), file.url)
        )

    def file_rows(self, chunk: Chunk, fs: FileSystemSpec, options: ReadOptions) -> np.ndarray:
        """The row number in its data file of each of ``chunk``'s live rows."""
        file = self.table_options(options).file(chunk.path)
        return chunk_file_rows(chunk, file.row_groups, self.deleted(file, fs))

    # --- reading --------------------------------------------------------------------------------

    def _physical(
        self,
        chunk: Chunk,
        row_start: int,
        row_stop: int,
        fs: FileSystemSpec,
        options: IcebergReadOptions,
    ) -> _Physical | None:
        """What to decode for live rows ``[row_start, row_stop)`` of ``chunk`` (``None``:
        nothing)."""
        file = options.file(chunk.path)
        read = physical_read(chunk, file.row_groups, self.deleted(file, fs), row_start, row_stop)
        if read is None:
            return None
        return _Physical(read, self._projection(file, fs, options))

    def prefetch(
        self,
        chunk: Chunk,
        row_start: int,
        row_stop: int,
        fs: FileSystemSpec,
        options: ReadOptions,
    ) -> None:
        """A hint that ``read`` of these live rows comes next: ParquetFormat starts fetching
        the physical rows' bytes (remote storage)."""
        if fs.is_local:
            return
        physical = self._physical(chunk, row_start, row_stop, fs, self.table_options(options))
        if physical is not None:
            read, columns = physical.read, ReadOptions(columns=physical.projection.columns)
            self._parquet.prefetch(read.chunk, read.start, read.stop, fs, columns)

    def read(
        self,
        chunk: Chunk,
        row_start: int,
        row_stop: int,
        fs: FileSystemSpec,
        options: ReadOptions,
    ) -> Iterator[pa.RecordBatch]:
        """Live rows ``[row_start, row_stop)`` of ``chunk`` in the table's schema, in order.

        Raises:
            SchemaMismatchError: a file's columns do not resolve to the table's.
            CorruptFileError: a file's bytes cannot be decoded.
            StorageError: the storage failed.
        """
        opts = self.table_options(options)
        physical = self._physical(chunk, row_start, row_stop, fs, opts)
        if physical is None:
            return
        schema = projected_schema(opts.schema_json, opts.columns)
        target = arrow_schema(opts.schema_json, opts.columns)
        where = f"{fs.url(chunk.path)} (Iceberg table {opts.table})"
        read = physical.read
        position = read.start
        columns = ReadOptions(columns=physical.projection.columns)
        for batch in self._parquet.read(read.chunk, read.start, read.stop, fs, columns):
            mask = keep_mask(read.deleted, position, batch.num_rows)
            position += batch.num_rows
            live = batch if mask is None else batch.filter(pa.array(mask))
            if live.num_rows:
                yield project(
                    live,
                    schema,
                    physical.projection,
                    target,
                    format_version=opts.format_version,
                    where=where,
                )

    def quick_start(self, rows: int) -> None:
        self._parquet.quick_start(rows)  # (its data files' first row group)

    def close(self) -> None:
        self._parquet.close()
        self._deleted.clear()
        self._delete_files.clear()
