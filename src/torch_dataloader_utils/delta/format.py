"""The Delta `Format`: reads a plan's chunks (row-group ranges of Parquet data files) with the
deletion vectors applied, columns matched by column mapping, partition columns added.

Decoding is ParquetFormat's: `read` maps the live rows asked for to the physical rows to decode
(`sources.table_deletes`), reads the file's columns with ``ParquetFormat.read``, drops the
deleted rows batch by batch, and builds the table's logical columns (`mapping`); INT96
timestamps (Spark's) are decoded in microseconds, Delta's unit. Planning is not done here: a
table is planned from its log (`sources.table_planning.plan_table`).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import pyarrow as pa

from ..formats import ReadOptions
from ..formats.handles import HandleCache
from ..formats.parquet import ParquetFormat
from ..fs import FileSystemSpec, ListedFile
from ..planning import Chunk
from ..sources.deletion_vectors import read_delta_dv
from ..sources.table_deletes import PhysicalRead, chunk_file_rows, keep_mask, physical_read
from ..sources.tables import TableFormat
from .mapping import file_columns, parse_fields, to_logical
from .options import DeltaFileInfo, DeltaReadOptions

__all__ = ["DeltaFormat"]

# Per worker: data files whose column matching is kept, and whose deleted positions are kept.
_FILES = 64
_DELETED = 8


def partition_value(value: Any, t: pa.DataType) -> pa.Scalar:
    """A partition value (as deltalake parsed it) in its column's type."""
    return pa.scalar(None, t) if value is None else pa.scalar(value).cast(t)


# Delta timestamps are microseconds; Spark writes them as INT96 (its legacy default), which
# pyarrow decodes to nanoseconds by default and so overflows past 2262 (9999-12-31 reads as 1816).
_INT96_UNIT = "us"


class DeltaFormat(TableFormat[DeltaReadOptions]):
    """Parquet data files of a Delta table, read with deletion vectors and column mapping.

    Stateless apart from per-process caches (dropped when pickled and on `close`).
    """

    name = "delta"
    options_type = DeltaReadOptions
    planned_from = "a Delta table is planned from its log"
    read_as = 'use create_dataloader("<table location>", format="delta")'

    def __init__(self) -> None:
        self._parquet = ParquetFormat(int96_unit=_INT96_UNIT)
        self._columns: HandleCache[str, dict[str, str | None]] = HandleCache(_FILES)
        self._deleted: HandleCache[str, np.ndarray] = HandleCache(_DELETED)

    def __reduce__(self) -> tuple[type[DeltaFormat], tuple[()]]:
        return (type(self), ())  # caches stay behind: each process fills its own

    def schema(self, file: ListedFile, fs: FileSystemSpec) -> pa.Schema:
        """The physical schema of one data file (its own column names)."""
        return self._parquet.schema(file, fs)

    def deleted(self, file: DeltaFileInfo, fs: FileSystemSpec, root: str) -> np.ndarray:
        """The sorted positions of ``file`` that its deletion vector deletes."""
        dv = file.deletion_vector
        if dv is None:
            return np.empty(0, dtype=np.int64)
        return self._deleted.get(
            file.path, lambda: read_delta_dv(dv, root, fs, data_file=fs.url(file.path))
        )

    def file_rows(self, chunk: Chunk, fs: FileSystemSpec, options: ReadOptions) -> np.ndarray:
        """The row number in its data file of each of ``chunk``'s live rows."""
        opts = self.table_options(options)
        file = opts.file(chunk.path)
        return chunk_file_rows(chunk, file.row_groups, self.deleted(file, fs, opts.root))

    def _file_columns(
        self, file: DeltaFileInfo, fs: FileSystemSpec, opts: DeltaReadOptions
    ) -> dict[str, str | None]:
        """The read columns that are in data files, each as this file names it."""
        wanted = tuple(c for c in self._wanted(opts) if c not in opts.partitions)

        def make() -> dict[str, str | None]:
            physical = self._parquet.schema(ListedFile(file.path, file.size, ""), fs)
            matched = file_columns(physical, opts.schema_json, wanted, opts.mapping)
            if not any(matched.values()) and len(physical):
                matched[""] = physical.names[0]  # (read one column: its rows are counted)
            return matched

        key = f"{file.path}\0{opts.schema_json}\0{wanted}"
        return self._columns.get(key, make)

    @staticmethod
    def _wanted(opts: DeltaReadOptions) -> tuple[str, ...]:
        assert opts.arrow is not None
        return tuple(opts.arrow.names) if opts.columns is None else opts.columns

    def _physical(
        self,
        chunk: Chunk,
        row_start: int,
        row_stop: int,
        fs: FileSystemSpec,
        opts: DeltaReadOptions,
    ) -> PhysicalRead | None:
        """What to decode for live rows ``[row_start, row_stop)`` of ``chunk`` (``None``:
        nothing)."""
        file = opts.file(chunk.path)
        deleted = self.deleted(file, fs, opts.root)
        return physical_read(chunk, file.row_groups, deleted, row_start, row_stop)

    def prefetch(
        self, chunk: Chunk, row_start: int, row_stop: int, fs: FileSystemSpec, options: ReadOptions
    ) -> None:
        """A hint that ``read`` of these live rows comes next: ParquetFormat starts fetching
        the physical rows' bytes (remote storage)."""
        if fs.is_local:
            return
        opts = self.table_options(options)
        physical = self._physical(chunk, row_start, row_stop, fs, opts)
        if physical is not None:
            names = self._file_columns(opts.file(chunk.path), fs, opts)
            columns = ReadOptions(columns=tuple(n for n in names.values() if n))
            self._parquet.prefetch(physical.chunk, physical.start, physical.stop, fs, columns)

    def read(
        self, chunk: Chunk, row_start: int, row_stop: int, fs: FileSystemSpec, options: ReadOptions
    ) -> Iterator[pa.RecordBatch]:
        """Live rows ``[row_start, row_stop)`` of ``chunk`` in the table's logical schema.

        Raises:
            SchemaMismatchError: a file's column cannot be read as the table's type.
            CorruptFileError: a data file or deletion vector cannot be decoded.
            StorageError: the storage failed.
        """
        opts = self.table_options(options)
        physical = self._physical(chunk, row_start, row_stop, fs, opts)
        if physical is None:
            return
        file = opts.file(chunk.path)
        names = self._file_columns(file, fs, opts)
        read = tuple(dict.fromkeys(n for n in names.values() if n))
        wanted = self._wanted(opts)
        assert opts.arrow is not None
        target = pa.schema([opts.arrow.field(c) for c in wanted])
        types = {f.name: f.type for f in parse_fields(opts.schema_json)}
        partition = dict(file.partition)
        where = f"{fs.url(chunk.path)} ({opts.table})"
        position = physical.start
        columns = ReadOptions(columns=read)
        for batch in self._parquet.read(physical.chunk, physical.start, physical.stop, fs, columns):
            mask = keep_mask(physical.deleted, position, batch.num_rows)
            position += batch.num_rows
            live = batch if mask is None else batch.filter(pa.array(mask))
            if not live.num_rows:
                continue
            arrays = []
            for field in target:
                if field.name in opts.partitions:
                    value = partition_value(partition.get(field.name), field.type)
                    arrays.append(pa.repeat(value, live.num_rows))
                elif names.get(field.name) is None:
                    arrays.append(pa.nulls(live.num_rows, field.type))
                else:
                    column = live.column(names[field.name])
                    arrays.append(
                        to_logical(column, types[field.name], field.type, opts.mapping, where)
                    )
            yield pa.RecordBatch.from_arrays(arrays, schema=target)

    def quick_start(self, rows: int) -> None:
        self._parquet.quick_start(rows)  # (its data files' first row group)

    def close(self) -> None:
        self._parquet.close()
        self._columns.clear()
        self._deleted.clear()
