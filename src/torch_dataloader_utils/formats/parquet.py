"""Parquet: chunks are row-group ranges, planned from footers read in parallel threads."""

from __future__ import annotations

import functools
import time
from collections import OrderedDict
from collections.abc import Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, NamedTuple

import pyarrow as pa
import pyarrow.parquet as pq

from ..errors import CorruptFileError
from ..fs import FileSystemSpec, SourceFile, translate_os_error
from ..fs.progress import Progress
from ..fs.ranges import RangeFetcher, RangeFile, ReadsAhead
from ..fs.threads import PLAN_THREADS
from ..planning import Chunk
from .base import Format, FormatPlan, ReadOptions
from .chunking import group_units
from .handles import HandleCache
from .magic import refuse_other_format
from .names import unique_schema, warn_renamed
from .opening import open_input, parsing, slice_batches
from .parquet_facts import FileFacts, chunk_ranges, leaf_owners, read_facts
from .parquet_footer import Footer, footer_file, read_footer
from .parquet_leafless import ParquetReadOptions, put_back, read_options
from .parquet_names import Renaming, asked
from .schemas import FileSchema, check_schemas

__all__ = ["ParquetFormat"]

# A decoded batch inside a row group holds at most this many rows and, by the footer's
# uncompressed sizes of the columns read, about this many bytes: a batch is a slice of what
# pyarrow decoded, and keeps all of it alive until the last slice is gone (16,384 rows of 2 MB
# values: a whole 600 MB row group in one batch; now 4 rows a batch). See docs/concepts/memory.md.
_READ_BATCH_ROWS = 16_384
_READ_BATCH_BYTES = 8 << 20
# Open files kept per worker. An open ParquetFile keeps its pre-buffered row group alive (measured:
# 8 cached files held ~360 MB), and shuffled streams rarely revisit a file, so keep one.
_OPEN_FILES = 1
# Remote files: footers kept per worker (about 40 KB each), and row groups fetched ahead of the
# one being decoded: the next one of the chunk, and the next piece's first. Memory: the row group
# decoded plus at most this many fetched or in flight (projected compressed bytes).
_FOOTERS = 16
_AHEAD = 2
# A read of at most this share of a row group's first rows streams its pages (1 MiB requests)
# instead of fetching whole column chunks: the plan-time sample of a row's decoded size.
_HEAD_SHARE = 8
_STREAM_BUFFER = 1 << 20
# A remote row group whose projected column chunks are larger than this is streamed (read in
# `_REMOTE_BUFFER` requests as pyarrow decodes) instead of fetched whole ahead of decoding: one
# row group of 2,000 rows of 2 MB is 4 GB. Local files always stream, in `_STREAM_BUFFER`
# reads: without a buffer pyarrow reads each column chunk whole (measured, a 600 MB row group
# of 2 MB values in 2 MB pages: pyarrow's pool peaked at 620 MB without, 23 MB with); reading
# was as fast (4 M narrow rows: 0.37 s either way).
_FETCH_BYTES = 64 << 20
# Files per planning task, at most: progress is counted per task.
_TASK_FILES = 256
# Local planning goes on in threads when the first task spent this share of its time waiting
# (wall clock, not CPU time).
_LOCAL_WAITING = 0.5
_REMOTE_BUFFER = 8 << 20


class _Remote(NamedTuple):
    """What reading a remote file needs: its footer, parsed and checked, and its size."""

    metadata: pq.FileMetaData
    footer: Footer
    size: int
    renaming: Renaming | None


class ParquetFormat(Format):
    """Apache Parquet.

    Planning reads each footer once, in parallel threads, prunes row groups by their statistics
    against the filter (and hive partition values), and groups consecutive row groups into
    chunks. Workers re-open the file (one footer read per file per worker) rather than receive
    pickled footers: a footer pickles to ~40 KB, which ``spawn`` would copy into every worker for
    every file, while a re-read costs one small request (see docs/adr/0002). Columns whose
    names repeat or are empty are read under unique names (`names`, `Renaming`).

    Args:
        verify_checksums: verify the page checksums a file carries (a mismatch raises
            `CorruptFileError` naming the file and row group); files without them cost nothing.
    """

    name = "parquet"

    def __init__(self, *, verify_checksums: bool = True) -> None:
        # Page CRCs, where the writer stored them (pyarrow's write_page_checksum=True, Spark,
        # parquet-mr): a flipped bit is a CorruptFileError, not a wrong value. Measured: ~8%
        # more decode time on files that carry them (2M rows, 3 columns); none without.
        self.verify_checksums = verify_checksums
        self._open: HandleCache[str, tuple[pq.ParquetFile, Renaming | None]] = HandleCache(
            _OPEN_FILES, lambda opened: opened[0].close()
        )
        # Remote reads: footers and file sizes, row groups fetched ahead (by row group), the
        # fetch threads. Open files, reads ahead and fetch threads are per process (a forked
        # child starts its own: `fs.forks`); footers are facts, a child may use its parent's.
        self._footers: OrderedDict[str, _Remote] = OrderedDict()
        self._ahead: ReadsAhead[tuple[str, int], dict[int, bytes | bytearray]] = ReadsAhead(_AHEAD)
        self._fetcher: RangeFetcher | None = None

    def __reduce__(self) -> tuple[Any, tuple[()]]:
        # Open files stay behind: each process opens its own.
        return (functools.partial(type(self), verify_checksums=self.verify_checksums), ())

    def schema(self, file: SourceFile, fs: FileSystemSpec) -> pa.Schema:
        url = fs.url(file.path)
        if file.size == 0:
            raise CorruptFileError(f"{url}: the file is empty (0 bytes), not a Parquet file")

        def read() -> pa.Schema:
            with open_input(file.path, fs) as source, parsing(url):
                return unique_schema(pq.read_schema(source).remove_metadata())

        try:
            return fs.request(read, what=url)
        except CorruptFileError as exc:  # say so when it is another format
            refuse_other_format(file, fs, "Parquet", exc)
            raise

    def plan(
        self,
        files: Sequence[SourceFile],
        partitions: Sequence[tuple[tuple[str, object], ...]],
        fs: FileSystemSpec,
        options: ReadOptions,
    ) -> FormatPlan:
        pairs = list(zip(files, partitions, strict=True))
        # Tasks of several files each: one task per file spent more time handing out tasks
        # than reading local footers (measured: 10k files, 0.97 s vs 0.31 s for the reads);
        # at most `_TASK_FILES`, so that progress is counted as it happens.
        per_task = max(1, min(_TASK_FILES, len(pairs) // (PLAN_THREADS * 4)))
        tasks = [pairs[i : i + per_task] for i in range(0, len(pairs), per_task)]
        progress = Progress("Parquet footers read", len(pairs))

        def read(task: list[tuple[SourceFile, tuple[tuple[str, object], ...]]]) -> list[FileFacts]:
            found = [read_facts(f, p, fs, options) for f, p in task]
            progress.add(len(found))
            return found

        facts: list[FileFacts] = []
        if fs.is_local and tasks:
            # A local footer read is mostly the walk of the footer, which holds the GIL: threads
            # only take turns (measured, 20,000 files on 2 cores: 10-20% slower with 8 or 32).
            # The first task runs here; the rest too unless it spent its time waiting (a
            # network filesystem mounted locally, a cold disk), which threads overlap.
            wall, cpu = time.perf_counter(), time.thread_time()
            facts.extend(read(tasks[0]))
            wall, cpu = time.perf_counter() - wall, time.thread_time() - cpu
            tasks = tasks[1:]
            if wall - cpu < _LOCAL_WAITING * wall:
                for task in tasks:
                    facts.extend(read(task))
                tasks = []
        if tasks:
            pool = ThreadPoolExecutor(
                max(1, min(PLAN_THREADS, len(tasks))), thread_name_prefix="tdu-plan"
            )
            try:
                for found in pool.map(read, tasks):
                    facts.extend(found)
            finally:  # on an error, the files not started yet are not read
                pool.shutdown(wait=True, cancel_futures=True)
        progress.finish()
        for f, fact in zip(files, facts, strict=True):
            if fact.renamed is not None:
                warn_renamed(fs.url(f.path), fact.renamed, stacklevel=3)
        schema = check_schemas(*_distinct_schemas(files, facts), fs, options)
        chunks: list[Chunk] = []
        rows = uncompressed = 0
        for f, fact, partition in zip(files, facts, partitions, strict=True):
            units = [(rg, n, size) for rg, n, size, _ in fact.row_groups]
            chunks.extend(group_units(f.path, units, partition, options))
            for r in fact.row_groups:
                rows += r[1]
                uncompressed += r[3]
        row_bytes = uncompressed / rows if rows else 1.0
        return FormatPlan(
            chunks=chunks,
            schema=schema,
            row_bytes=max(row_bytes, 1.0),
            read_options=read_options(options, schema),
        )

    def _file(self, path: str, fs: FileSystemSpec) -> tuple[pq.ParquetFile, Renaming | None]:
        def open_file() -> tuple[pq.ParquetFile, Renaming | None]:
            source = open_input(path, fs)
            try:
                with parsing(fs.url(path)):
                    handle = pq.ParquetFile(
                        source,
                        pre_buffer=False,
                        buffer_size=_STREAM_BUFFER,
                        page_checksum_verification=self.verify_checksums,
                    )
                    return handle, Renaming.of(handle.schema_arrow)
            except BaseException:  # corrupt, or the storage failed mid-parse
                source.close()
                raise

        return self._open.get(path, open_file)

    def read(
        self,
        chunk: Chunk,
        row_start: int,
        row_stop: int,
        fs: FileSystemSpec,
        options: ReadOptions,
    ) -> Iterator[pa.RecordBatch]:
        batches = self._read(chunk, row_start, row_stop, fs, options)
        if isinstance(options, ParquetReadOptions) and options.leafless is not None:
            # pyarrow leaves out columns without leaf columns: never drop one (parquet_leafless)
            return put_back(batches, options.columns, options.leafless)
        return batches

    def _read(
        self,
        chunk: Chunk,
        row_start: int,
        row_stop: int,
        fs: FileSystemSpec,
        options: ReadOptions,
    ) -> Iterator[pa.RecordBatch]:
        url = fs.url(chunk.path)
        if fs.is_local:
            renaming = self._file(chunk.path, fs)[1]
        else:
            renaming = self._footer(chunk.path, fs).renaming
        batches = self._decode(chunk, row_start, row_stop, fs, asked(renaming, options.columns))
        yield from batches if renaming is None else renaming.rename(batches, options.columns, url)

    def _decode(
        self,
        chunk: Chunk,
        row_start: int,
        row_stop: int,
        fs: FileSystemSpec,
        columns: list[str] | None,
    ) -> Iterator[pa.RecordBatch]:
        """Rows ``[row_start, row_stop)`` of ``chunk``, of the file's columns ``columns``."""
        url = fs.url(chunk.path)
        spans = list(_row_group_spans(chunk, row_start, row_stop))
        for k, (rg, lo, hi, rg_rows) in enumerate(spans):
            where = f"{url} row group {rg} (rows {lo}:{hi})"
            if fs.is_local:
                handle = self._file(chunk.path, fs)[0]
                with parsing(where):
                    # One thread: pyarrow's column threads cost more than they give at these
                    # sizes (measured 2.8 M vs 2.4 M rows/s), and workers are processes anyway.
                    batches = handle.iter_batches(
                        batch_size=_batch_rows(handle.metadata, rg, columns),
                        row_groups=[rg],
                        columns=columns,
                        use_threads=False,
                    )
                    yield from slice_batches(batches, lo, hi, where)
                continue
            yield from self._read_remote(
                chunk.path,
                rg,
                lo=lo,
                hi=hi,
                rg_rows=rg_rows,
                columns=columns,
                fs=fs,
                where=where,
                after=spans[k + 1][0] if k + 1 < len(spans) else None,
            )

    def prefetch(
        self,
        chunk: Chunk,
        row_start: int,
        row_stop: int,
        fs: FileSystemSpec,
        options: ReadOptions,
    ) -> None:
        """Start fetching the first row group of rows ``[row_start, row_stop)`` (remote)."""
        if fs.is_local:
            return
        for rg, lo, hi, rg_rows in _row_group_spans(chunk, row_start, row_stop):
            if not _head_only(lo, hi, rg_rows):
                renaming = self._footer(chunk.path, fs).renaming  # read next anyway
                self._fetch_ahead(chunk.path, rg, asked(renaming, options.columns), fs)
            return

    # --- remote reading: whole column chunks fetched in parallel, ahead of decoding ---------

    def _footer(self, path: str, fs: FileSystemSpec) -> _Remote:
        found = self._footers.get(path)
        if found is not None:
            self._footers.move_to_end(path)
            return found
        url = fs.url(path)

        def read() -> _Remote:
            with open_input(path, fs) as source, parsing(url):
                size = source.size()
                checked, thrift, start = read_footer(source, size, url)
                tail = footer_file(source, size, start, thrift)
                metadata = pq.read_metadata(tail)  # remote only: no second request
                renaming = Renaming.of(metadata.schema.to_arrow_schema())
                return _Remote(metadata, checked, size, renaming)

        found = fs.request(read, what=url)
        self._footers[path] = found
        while len(self._footers) > _FOOTERS:
            self._footers.popitem(last=False)
        return found

    def _fetch(
        self, path: str, rg: int, columns: list[str] | None, fs: FileSystemSpec
    ) -> Future[dict[int, bytes | bytearray]]:
        """Row group ``rg``'s bytes: fetched ahead (handed over), or a new fetch."""
        started = self._ahead.take((path, rg))
        if started is not None:
            return started
        metadata, footer, _, _ = self._footer(path, fs)
        return self._fetcher_of(fs).fetch(path, chunk_ranges(metadata, footer, rg, columns))

    def _fetch_ahead(
        self, path: str, rg: int, columns: list[str] | None, fs: FileSystemSpec
    ) -> None:
        """Start fetching row group ``rg`` ahead of its read, unless `_AHEAD` fetches are
        pending (this one is dropped, never one of those: a cancelled fetch would be fetched
        twice) or it is too big to hold whole (streamed when it is read)."""

        def begin() -> Future[dict[int, bytes | bytearray]] | None:
            metadata, footer, _, _ = self._footer(path, fs)
            ranges = chunk_ranges(metadata, footer, rg, columns)
            if sum(n for _, n in ranges) > _FETCH_BYTES:
                return None
            return self._fetcher_of(fs).fetch(path, ranges)

        self._ahead.start((path, rg), begin)

    def _fetcher_of(self, fs: FileSystemSpec) -> RangeFetcher:
        if self._fetcher is None:
            self._fetcher = RangeFetcher(fs.read_range)
        return self._fetcher

    def _read_remote(
        self,
        path: str,
        rg: int,
        *,
        lo: int,
        hi: int,
        rg_rows: int,
        columns: list[str] | None,
        fs: FileSystemSpec,
        where: str,
        after: int | None,
    ) -> Iterator[pa.RecordBatch]:
        """Rows ``[lo, hi)`` of row group ``rg``; row group ``after`` starts downloading
        once this one's requests are out."""
        metadata, footer, size, _ = self._footer(path, fs)
        if (path, rg) not in self._ahead and (
            sum(n for _, n in chunk_ranges(metadata, footer, rg, columns)) > _FETCH_BYTES
        ):
            # Too big to hold whole: pyarrow reads the pages as it decodes them, through the
            # retried range reads.
            if after is not None:
                self._fetch_ahead(path, after, columns, fs)
            source = RangeFile(size, {}, lambda offset, n: fs.read_range(path, offset, n))
            yield from self._rows(
                source.arrow(),
                metadata,
                rg,
                lo=lo,
                hi=hi,
                columns=columns,
                where=where,
                buffer_size=_REMOTE_BUFFER,
            )
            return
        if _head_only(lo, hi, rg_rows) and (path, rg) not in self._ahead:
            # A few first rows: stream the first pages rather than fetch whole column chunks.
            def head() -> list[pa.RecordBatch]:
                with open_input(path, fs) as source:
                    rows = self._rows(
                        source,
                        metadata,
                        rg,
                        lo=lo,
                        hi=hi,
                        columns=columns,
                        where=where,
                        buffer_size=_STREAM_BUFFER,
                    )
                    return list(rows)

            yield from fs.request(head, what=where)
            return
        future = self._fetch(path, rg, columns, fs)
        if after is not None:
            self._fetch_ahead(path, after, columns, fs)
        try:
            buffers = future.result()
        except OSError as exc:
            raise translate_os_error(exc, where) from exc
        source = RangeFile(size, buffers, lambda offset, n: fs.read_range(path, offset, n))
        yield from self._rows(
            source.arrow(), metadata, rg, lo=lo, hi=hi, columns=columns, where=where
        )

    def _rows(
        self,
        source: pa.NativeFile,
        metadata: pq.FileMetaData,
        rg: int,
        *,
        lo: int,
        hi: int,
        columns: list[str] | None,
        where: str,
        buffer_size: int = 0,
    ) -> Iterator[pa.RecordBatch]:
        """Rows ``[lo, hi)`` of row group ``rg`` decoded from ``source`` (``buffer_size``:
        pyarrow's read buffer; 0 reads each column chunk whole)."""
        with parsing(where):
            handle = pq.ParquetFile(
                source,
                metadata=metadata,
                pre_buffer=False,
                buffer_size=buffer_size,
                page_checksum_verification=self.verify_checksums,
            )
            batches = handle.iter_batches(
                batch_size=_batch_rows(metadata, rg, columns),
                row_groups=[rg],
                columns=columns,
                use_threads=False,
            )
            yield from slice_batches(batches, lo, hi, where)

    def close(self) -> None:
        self._open.clear()
        self._ahead.close()
        if self._fetcher is not None:
            self._fetcher.close()
            self._fetcher = None


def _distinct_schemas(
    files: Sequence[SourceFile], facts: Sequence[FileFacts]
) -> tuple[list[SourceFile], list[FileSchema]]:
    """The files to check the schemas of: the first with each schema (files that share a footer
    schema share the object, `parquet_facts._arrow_schema`), once with rows and once without.

    `check_schemas` reports the same outcome on these as on all the files, naming the same
    files: it reports the first file of the kind it looks for, and each kind's first file is
    kept (so is the first file, which its messages name).
    """
    seen: set[tuple[int, bool]] = set()
    kept_files: list[SourceFile] = []
    kept: list[FileSchema] = []
    for f, fact in zip(files, facts, strict=True):
        key = (id(fact.schema), bool(fact.row_groups))
        if key not in seen:
            seen.add(key)
            kept_files.append(f)
            kept.append(FileSchema(fact.schema, key[1]))
    return kept_files, kept


def _row_group_spans(
    chunk: Chunk, row_start: int, row_stop: int
) -> Iterator[tuple[int, int, int, int]]:
    """``(row group, first row, stop row, rows)`` of each row group of ``chunk`` that rows
    ``[row_start, row_stop)`` touch, rows counted inside the row group."""
    first = 0  # row of the chunk where the current row group starts
    for rg, rg_rows in zip(range(chunk.start, chunk.stop), chunk.unit_rows, strict=True):
        lo, hi = max(row_start, first), min(row_stop, first + rg_rows)
        if lo < hi:
            yield rg, lo - first, hi - first, rg_rows
        first += rg_rows
        if first >= row_stop:
            return


def _batch_rows(metadata: pq.FileMetaData, rg: int, columns: Sequence[str] | None) -> int:
    """Rows per decoded batch of row group ``rg``: about `_READ_BATCH_BYTES` of the columns
    read (the footer's uncompressed sizes), at most `_READ_BATCH_ROWS`."""
    row_group = metadata.row_group(rg)
    rows = int(row_group.num_rows)
    if row_group.total_byte_size * _READ_BATCH_ROWS <= _READ_BATCH_BYTES * max(rows, 1):
        return _READ_BATCH_ROWS  # narrow rows, whatever the projection: no column walk
    owners = leaf_owners(metadata.schema.to_arrow_schema())
    wanted = set(columns) if columns is not None else None
    nbytes = sum(
        int(row_group.column(j).total_uncompressed_size)
        for j, owner in enumerate(owners)
        if wanted is None or owner in wanted
    )
    return max(1, min(_READ_BATCH_ROWS, _READ_BATCH_BYTES * rows // max(nbytes, 1)))


def _head_only(lo: int, hi: int, rows: int) -> bool:
    return lo == 0 and hi * _HEAD_SHARE <= rows
