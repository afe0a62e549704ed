"""Parquet: chunks are row-group ranges, planned from footers read in parallel threads."""

from __future__ import annotations

import functools
from collections import OrderedDict
from collections.abc import Iterator, Sequence
from concurrent.futures import Future
from typing import Any, NamedTuple

import pyarrow as pa
import pyarrow.parquet as pq

from ...errors import CorruptFileError
from ...fs import FileSystemSpec, ListedFile, translate_os_error
from ...fs.ranges import RangeFetcher, RangeFile, ReadsAhead
from ...planning import Chunk
from ..base import Format, FormatPlan, Listing, ReadOptions
from ..handles import HandleCache
from ..magic import refuse_other_format
from ..names import unique_schema
from ..opening import open_input, parsing, slice_batches
from .facts import chunk_ranges
from .footer import Footer, footer_file, read_footer
from .leafless import ParquetReadOptions, put_back
from .planning import assemble, read_all
from .renaming import Renaming, asked
from .row_groups import batch_rows, quick_rows, row_group_spans

__all__ = ["ParquetFormat"]

# Why each value below, with the numbers measured: docs/adr/0019-format-measurements.md.
# Open files per worker: one holds its pre-buffered row group, and shuffles rarely come back.
_OPEN_FILES = 1
# Remote: footers kept per worker (~40 KB each), and row groups fetched ahead of the one decoded.
_FOOTERS = 16
_AHEAD = 2
# A read of at most 1/_HEAD_SHARE of a row group's first rows streams pages, not column chunks.
_HEAD_SHARE = 8
# pyarrow's read buffer, local files and head reads: without one it holds column chunks whole.
_STREAM_BUFFER = 1 << 20
# A remote row group larger than this (projected) is streamed, not fetched whole ahead.
_FETCH_BYTES = 64 << 20
_REMOTE_BUFFER = 8 << 20  # the buffer of such a streamed read


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
        int96_unit: the unit legacy INT96 timestamps decode to (``None``: pyarrow's, ns);
            a table whose timestamps are microseconds says ``"us"`` (Delta: docs/adr/0031).
    """

    name = "parquet"

    def __init__(self, *, verify_checksums: bool = True, int96_unit: str | None = None) -> None:
        # Page CRCs, where the writer stored them (pyarrow's write_page_checksum=True, Spark,
        # parquet-mr): a flipped bit is a CorruptFileError, not a wrong value. Its cost:
        # docs/adr/0019-format-measurements.md.
        self.verify_checksums = verify_checksums
        self.int96_unit = int96_unit
        self._open: HandleCache[str, tuple[pq.ParquetFile, Renaming | None]] = HandleCache(
            _OPEN_FILES, lambda opened: opened[0].close()
        )
        self._renamed: tuple[pq.ParquetSchema, Renaming | None] | None = None  # the last file's
        # Remote reads: footers and file sizes, row groups fetched ahead (by row group), the
        # fetch threads. Open files, reads ahead and fetch threads are per process (a forked
        # child starts its own: `fs.forks`); footers are facts, a child may use its parent's.
        self._footers: OrderedDict[str, _Remote] = OrderedDict()
        self._ahead: ReadsAhead[tuple[str, int], dict[int, bytes | bytearray]] = ReadsAhead(_AHEAD)
        self._fetcher: RangeFetcher | None = None
        self._quick = 0  # rows of a stream's first block, wanted soon (`quick_start`)

    def __reduce__(self) -> tuple[Any, tuple[()]]:
        # Open files stay behind: each process opens its own.
        made = functools.partial(
            type(self), verify_checksums=self.verify_checksums, int96_unit=self.int96_unit
        )
        return (made, ())

    def schema(self, file: ListedFile, fs: FileSystemSpec) -> pa.Schema:
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

    per_file = True  # (`Format.plan`: its footers' facts, assembled)

    def facts(self, listing: Listing, fs: FileSystemSpec, options: ReadOptions) -> list[Any]:
        return list(read_all(listing, fs, options))

    def assemble(
        self, listing: Listing, facts: Sequence[Any], fs: FileSystemSpec, options: ReadOptions
    ) -> FormatPlan:
        return assemble(listing, facts, fs, options)

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
                        coerce_int96_timestamp_unit=self.int96_unit,
                    )
                    return handle, self._renaming(handle)
            except BaseException:  # corrupt, or the storage failed mid-parse
                source.close()
                raise

        return self._open.get(path, open_file)

    def _renaming(self, handle: pq.ParquetFile) -> Renaming | None:
        """The renaming of ``handle``'s columns; the last file's when the Parquet schema is the
        same (docs/adr/0020-measurements-behind-constants.md#small-local-files)."""
        schema, last = handle.schema, self._renamed
        if last is not None and schema.equals(last[0]):
            return last[1]
        renaming = Renaming.of(handle.schema_arrow)
        self._renamed = (schema, renaming)
        return renaming

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
            # pyarrow leaves out columns without leaf columns: never drop one (`leafless`)
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
        if fs.is_local:
            renaming = self._file(chunk.path, fs)[1]
            columns = asked(renaming, options.columns)
            batches = self._decode_local(chunk, row_start, row_stop, fs, columns)
        else:
            renaming = self._footer(chunk.path, fs).renaming
            batches = self._decode(chunk, row_start, row_stop, fs, asked(renaming, options.columns))
        if renaming is None:
            yield from batches
        else:
            yield from renaming.rename(batches, options.columns, fs.url(chunk.path))

    def _decode_local(
        self,
        chunk: Chunk,
        row_start: int,
        row_stop: int,
        fs: FileSystemSpec,
        columns: list[str] | None,
    ) -> Iterator[pa.RecordBatch]:
        """`_decode` of a local file: each row group through the open file."""
        for rg, lo, hi, _ in row_group_spans(chunk, row_start, row_stop):
            handle = self._file(chunk.path, fs)[0]  # (opened again if a read between closed it)
            where = f"{chunk.path} row group {rg} (rows {lo}:{hi})"
            rows = batch_rows(handle.metadata, rg, columns, stop=hi)
            rows, self._quick = quick_rows(rows, self._quick, lo, hi), 0
            with parsing(where):
                # One thread: pyarrow's column threads cost more than they give here
                # (docs/adr/0019-format-measurements.md); workers are processes anyway.
                batches = handle.iter_batches(
                    batch_size=rows,
                    row_groups=[rg],
                    columns=columns,
                    use_threads=False,
                )
                yield from slice_batches(batches, lo, hi, where)

    def _decode(
        self,
        chunk: Chunk,
        row_start: int,
        row_stop: int,
        fs: FileSystemSpec,
        columns: list[str] | None,
    ) -> Iterator[pa.RecordBatch]:
        """Rows ``[row_start, row_stop)`` of a remote ``chunk``, of the file's columns
        ``columns``."""
        url = fs.url(chunk.path)
        spans = list(row_group_spans(chunk, row_start, row_stop))
        for k, (rg, lo, hi, rg_rows) in enumerate(spans):
            where = f"{url} row group {rg} (rows {lo}:{hi})"
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
        for rg, lo, hi, rg_rows in row_group_spans(chunk, row_start, row_stop):
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
                coerce_int96_timestamp_unit=self.int96_unit,
            )
            batches = handle.iter_batches(
                batch_size=batch_rows(metadata, rg, columns, stop=hi),
                row_groups=[rg],
                columns=columns,
                use_threads=False,
            )
            yield from slice_batches(batches, lo, hi, where)

    def quick_start(self, rows: int) -> None:
        # (A local read only: a remote one's first batch waits on its fetch.)
        self._quick = rows

    def close(self) -> None:
        self._quick = 0
        self._open.clear()
        self._ahead.close()
        if self._fetcher is not None:
            self._fetcher.close()
            self._fetcher = None


def _head_only(lo: int, hi: int, rows: int) -> bool:
    return lo == 0 and hi * _HEAD_SHARE <= rows
