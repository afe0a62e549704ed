"""Rows of a dataset's chunks as `rows_at` reports them (`ChunkRows`): each row's file and row
number in it, from the plan, and the columns asked for, read on demand."""

from __future__ import annotations

import dataclasses
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa

from ..cache import ReadCache
from ..convert.arrow_values import take
from ..errors import ColumnNotFoundError
from ..formats.partitions import with_partition
from ..fs import FileSystemSpec
from ..planning import Piece
from ..sources.planned import PlannedSource
from ..stream.read import Reader

__all__ = ["FILE_COLUMN", "ROW_COLUMN", "SOURCE_COLUMN", "ChunkRows"]

# The columns `rows_at` adds: each row's file (its URL), its row number in that file, and (a
# mixture's) its source.
FILE_COLUMN, ROW_COLUMN, SOURCE_COLUMN = "__file__", "__row__", "__source__"
# Chunks whose rows that pass a filter are kept numbered (each took a read of the chunk).
_KEPT_PASSING = 64


@dataclass(eq=False)
class ChunkRows:
    """The rows of a dataset's chunks, looked up by chunk and row (counted after the filter):
    their files and row numbers, and their columns read. Each chunk's first row in its file and
    the rows a filter passes are worked out once.

    Attributes:
        sources: the dataset's planned sources.
        cache: the node-local cache a source's files are read through, if there is one.
    """

    sources: tuple[PlannedSource, ...]
    cache: ReadCache | None
    _first_rows: dict[int, np.ndarray] = field(default_factory=dict)
    _passing: OrderedDict[tuple[int, int], np.ndarray] = field(default_factory=OrderedDict)

    def table(
        self, i: int, chunks: np.ndarray, kept: np.ndarray, columns: Sequence[str] | None
    ) -> pa.Table:
        """``columns`` of rows ``kept`` of chunks ``chunks`` of source ``i`` (``None``: the
        dataset's), in that order, with `FILE_COLUMN` and `ROW_COLUMN`."""
        table = self.read(i, chunks, kept, columns)
        urls, numbers = self.files_and_rows(i, chunks, kept)
        return table.append_column(FILE_COLUMN, urls).append_column(ROW_COLUMN, numbers)

    def read(
        self, i: int, chunks: np.ndarray, kept: np.ndarray, columns: Sequence[str] | None
    ) -> pa.Table:
        """``columns`` of rows ``kept`` of chunks ``chunks`` of source ``i``, in that order: one
        read of each chunk (none without columns)."""
        if columns is not None and not columns:
            return pa.table({"": pa.nulls(len(chunks))}).drop_columns([""])
        reader = self.reader(i, columns)
        parts: list[pa.RecordBatch] = []
        taken = np.empty(len(chunks), np.int64)
        base = 0
        for chunk in np.unique(chunks).tolist():
            mine = np.flatnonzero(chunks == chunk)
            wanted = kept[mine]
            lo, hi = int(wanted.min()), int(wanted.max()) + 1
            read = list(reader.read([([Piece(chunk, lo, hi)], None)]))
            block = read[0] if len(read) == 1 else pa.concat_batches(read)
            parts.append(block)
            taken[mine] = base + (wanted - lo)
            base += block.num_rows
        joined = pa.Table.from_batches(parts).combine_chunks()
        return pa.Table.from_batches([take(joined.to_batches()[0], taken)])

    def files_and_rows(
        self, i: int, chunks: np.ndarray, kept: np.ndarray
    ) -> tuple[pa.Array, pa.Array]:
        """The file (URL) and row in it of rows ``kept`` of chunks ``chunks`` of source ``i``
        (null where the plan cannot tell, as for the rows a transform yields); a filter's rows
        are numbered among all the chunk's."""
        source = self.sources[i]
        plan = source.plan
        unique, inverse = np.unique(chunks, return_inverse=True)
        files = plan.chunks.column("file")
        urls = [source.fs.url(plan.chunks.paths[int(files[c])]) for c in unique.tolist()]
        if source.read_options.filter is not None:  # rows that pass: numbered among all
            kept = kept.copy()
            for k, chunk in enumerate(unique.tolist()):
                mine = inverse == k
                kept[mine] = self._passing_rows(i, chunk)[kept[mine]]
        first = self.first_rows(i)[chunks]
        transformed = source.derive is not None and source.derive.counts_rows
        if transformed:
            first = np.full_like(first, -1)  # (a transform's rows have no row in the file)
        numbers = np.where(first >= 0, first + kept, -1)
        for k, chunk in enumerate([] if transformed else unique.tolist()):
            rows = self._file_rows(i, chunk)  # (a table's chunks: live rows, gaps between)
            if rows is not None:
                mine = inverse == k
                numbers[mine] = rows[kept[mine]]
        return (
            pa.array(urls, pa.string()).take(pa.array(inverse)),
            pa.array(numbers, pa.int64(), mask=numbers < 0),  # (null: not known)
        )

    def _file_rows(self, i: int, chunk: int) -> np.ndarray | None:
        """The row number in its file of each row of chunk ``chunk`` of source ``i``, where
        its format says (`Format.file_rows`); ``None``: the plan's counts tell them."""
        source = self.sources[i]
        return source.format.file_rows(
            source.plan.chunks[chunk], self.filesystem(i), source.read_options
        )

    def reader(self, i: int, columns: Sequence[str] | None) -> Reader:
        """A reader of source ``i``'s rows for lookups, of ``columns`` (``None``: the
        dataset's): only those read, and no checks of the output's."""
        source = self.sources[i]
        options, output = source.read_options, source.output_columns
        if columns is not None:
            output = tuple(columns)
            # (With a filter, its columns are read too; what a source computes from its rows
            # reads what planning said it needs.)
            if options.filter is None and source.derive is None:
                partitions = options.partition_schema
                known = set(partitions.names) if partitions is not None else set()
                options = dataclasses.replace(
                    options, columns=tuple(c for c in columns if c not in known)
                )
        return Reader(
            source.plan.chunks,
            source.format,
            self.filesystem(i),
            options,
            output_columns=output,
            files=source.plan.files,
            row_bytes=source.plan.row_bytes,
            schema=source.plan.schema,
            derive=source.derive,
            chunk_rows=source.plan.chunk_rows if source.derive is not None else None,
        )

    def checked(self, columns: Sequence[str]) -> tuple[str, ...]:
        """``columns``, each a column of every source.

        Raises:
            ColumnNotFoundError: one is not.
        """
        columns = [columns] if isinstance(columns, str) else list(columns)
        for source in self.sources:
            missing = [c for c in columns if c not in source.plan.schema.names]
            if missing:
                raise ColumnNotFoundError(
                    f"rows_at columns {missing} are not columns of {source.label} "
                    f"(columns: {source.plan.schema.names})"
                )
        return tuple(columns)

    def first_rows(self, i: int) -> np.ndarray:
        """Each chunk of source ``i``'s first row in its file (-1: not known)."""
        found = self._first_rows.get(i)
        if found is None:
            found = self._first_rows[i] = _first_rows(self.sources[i])
        return found

    def filesystem(self, i: int) -> FileSystemSpec:
        """Source ``i``'s filesystem, its files read through the cache (if any)."""
        source = self.sources[i]
        if self.cache is None:
            return source.fs
        return self.cache.wrap(source.fs, source.plan.files, immutable=source.immutable)

    def _passing_rows(self, i: int, chunk: int) -> np.ndarray:
        """The rows of chunk ``chunk`` of source ``i`` that pass its row filter, numbered among
        the chunk's rows (the last `_KEPT_PASSING` chunks' kept)."""
        key = (i, chunk)
        found = self._passing.get(key)
        if found is not None:
            self._passing.move_to_end(key)
            return found
        found = self._passing[key] = _passing(self.sources[i], chunk, self.filesystem(i))
        if len(self._passing) > _KEPT_PASSING:
            self._passing.popitem(last=False)
        return found


def _passing(source: PlannedSource, index: int, fs: FileSystemSpec) -> np.ndarray:
    """The rows of chunk ``index`` of ``source`` that pass its row filter, numbered among the
    chunk's rows."""
    chunk = source.plan.chunks[index]
    options = source.read_options
    out, base = [], 0
    for read in source.format.read(chunk, 0, chunk.num_rows, fs, options):
        batch = with_partition(read, chunk.partition, options)
        numbers = pa.array(np.arange(base, base + batch.num_rows, dtype=np.int64))
        kept = batch.append_column("__number__", numbers).filter(options.filter)
        out.append(kept.column("__number__").to_numpy())
        base += batch.num_rows
    return np.concatenate(out) if out else np.zeros(0, np.int64)


def _first_rows(source: PlannedSource) -> np.ndarray:
    """Each chunk's first row in its file (-1: not known). A file's chunks are consecutive in
    the plan, in file order: a chunk's first row is the rows of the chunks before it, where
    they start at the file's first native unit and leave none out; else (native units pruned
    by a filter) a Parquet footer's row groups tell it."""
    chunks = source.plan.chunks
    files, rows = chunks.column("file"), chunks.num_rows
    starts, stops = chunks.column("start"), chunks.column("stop")
    before = np.cumsum(rows) - rows
    opens = np.ones(len(files), bool)
    opens[1:] = files[1:] != files[:-1]
    first = np.maximum.accumulate(np.where(opens, np.arange(len(files)), 0))
    out: np.ndarray = before - before[first]
    # Where the plan left native units out (a gap, or a file's first chunk past its first).
    gaps = np.flatnonzero(opens & (starts != 0))
    joins = np.flatnonzero(~opens[1:] & (starts[1:] != stops[:-1])) + 1
    for file in np.unique(files[np.r_[gaps, joins].astype(np.int64)]).tolist():
        mine = np.flatnonzero(files == file)
        out[mine] = _footer_rows(source, chunks.paths[file], starts[mine])
    return out


def _footer_rows(source: PlannedSource, path: str, units: np.ndarray) -> np.ndarray:
    """The first rows of row groups ``units`` of a Parquet file (-1: not a Parquet file)."""
    if source.format.name != "parquet":
        return np.full(len(units), -1, np.int64)
    import pyarrow.parquet as pq

    with source.fs.open_input(path) as handle:
        meta = pq.ParquetFile(handle).metadata
        sizes = [meta.row_group(i).num_rows for i in range(meta.num_row_groups)]
    ends = np.cumsum([0, *sizes])
    found: np.ndarray = ends[units]
    return found
