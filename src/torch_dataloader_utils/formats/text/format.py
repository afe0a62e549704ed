"""CSV and JSON Lines: chunks are byte ranges cut at record starts, counted at plan time.

What both share lives here (`TextFormat`); `csv.CsvFormat` and `json.JsonFormat`
say how their records end, how their types are inferred and how a chunk is parsed.

Planning scans every file once (threads across files, ~8 MiB range reads, numpy finds the
newlines; see `records`) to cut it into chunks of about ``chunk_bytes`` (or ``split_bytes`` /
``split_rows``) and count each chunk's rows exactly: the equal-stream model needs the counts.
Column types are fixed once at plan time (inferred from the first ``infer_bytes`` of the first
file with rows, or given as ``schema=``), and every chunk is parsed with those EXPLICIT types:
inference per chunk drifts (``1,`` infers null in one chunk, int64 in another). They travel
with the plan, in its `TextReadOptions` (the format keeps no plan state).

Files that cannot be cut safely are one chunk each, their rows counted by a full parse at plan
time and skipped to ``row_start`` by parsing when read: compressed files (``.gz``, ``.bz2``,
``.zst``, ``.lz4``, ``.xz``), CSV with ``escape_char``, and CSV files where quote parity may
disagree with pyarrow's parser (see `records.RecordScan`).
"""

from __future__ import annotations

import io
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from ...errors import CorruptFileError, InvalidArgumentError, SchemaMismatchError
from ...errors.keywords import renamed
from ...fs import FileSystemSpec, ListedFile
from ...fs.threads import SCAN_THREADS
from ...planning import Chunk
from ..base import Format, FormatPlan, Listing, ReadOptions
from ..handles import HandleCache
from ..magic import HEAD_BYTES, TAIL_BYTES, check_text
from ..names import unique_names, warn_renamed
from ..opening import arrow_owned, each_file, open_input, parsing, read_range
from ..records import ChunkCutter, RecordScan, compression_of, open_decompressed, read_ranges
from ..schemas import FileSchema, check_schemas
from .options import TextParsing, TextReadOptions

__all__ = [
    "CHUNK_BYTES",
    "SCAN_BYTES",
    "TextFormat",
    "TextParsing",
    "TextReadOptions",
    "text_chunk_bytes",
]

CHUNK_BYTES = 16 << 20  # bytes per chunk without split targets (``chunk_bytes``'s default)
SCAN_BYTES = 8 << 20  # bytes per plan-time range read
_READ_BYTES = 32 << 20  # a chunk up to this size is fetched in one request
_UNPLANNED = 64  # specs kept per process for reads without the plan's options


def text_chunk_bytes(where: str, chunk_bytes: int | None, block_bytes: int | None) -> int:
    """``chunk_bytes``, or its earlier name ``block_bytes`` (with a `DeprecationWarning`), or
    `CHUNK_BYTES` (``where``: the format class, for the messages).

    Raises:
        InvalidArgumentError: both are given.
    """
    given = ("chunk_bytes", chunk_bytes)
    return int(renamed(where, given, ("block_bytes", block_bytes), CHUNK_BYTES))


@dataclass(frozen=True)
class _Scanned:
    names: tuple[str, ...] | None  # the CSV header's own names (None: no header or no bytes)
    chunks: list[tuple[int, int, int]]
    unsplit: str | None  # why the file is one chunk


class _RangeStream(io.RawIOBase):
    """Bytes ``[start, stop)`` of a file, fetched in `_READ_BYTES` range reads as pyarrow's
    streaming reader asks for them."""

    def __init__(self, path: str, start: int, stop: int, fs: FileSystemSpec) -> None:
        self.path, self.pos, self.stop, self.fs = path, start, stop, fs
        self.buffer = memoryview(b"")

    def readable(self) -> bool:
        return True

    def readinto(self, b: Any) -> int:
        if not self.buffer and self.pos < self.stop:
            size = min(_READ_BYTES, self.stop - self.pos)
            self.buffer = memoryview(read_range(self.path, self.pos, size, self.fs))
            self.pos += size
        n = min(len(b), len(self.buffer))
        b[:n] = self.buffer[:n]
        self.buffer = self.buffer[n:]
        return n


def _unclosed_quote(scan: RecordScan) -> tuple[int, str] | None:
    """Where the scan found a quote never closed, and what that does, or None."""
    if scan.unclosed_at is not None:
        return scan.unclosed_at, (
            f"is never closed: the rest of the file ({scan.offset - scan.unclosed_at} bytes) "
            "would be read as one value and the records in it lost"
        )
    if scan.unclosed_before is not None:
        closer, opener = scan.unclosed_before
        return closer, (
            f"closes the value opened at byte {opener} but is followed by neither a delimiter "
            "nor a line end: a quote before it is probably never closed, which would join the "
            "records after it into one value and lose them"
        )
    return None


class TextFormat(Format):
    """What CSV and JSON Lines share: the plan-time scan, chunk sources, row slicing.

    A subclass says what differs through the hooks below: ``_scanner`` (where records end),
    ``_infer`` (the `TextParsing`), ``_reader`` (parsing a chunk's bytes), and for CSV
    ``_has_header``, ``_header`` and ``_unsplittable``.

    Args:
        schema: the columns and their types (``None``: inferred once when planning).
        chunk_bytes: bytes per chunk without ``split_bytes``/``split_rows``.
        infer_bytes: bytes the types are inferred from.
        quote: the quote byte the record scan tracks parity of (``None``: every newline
            ends a record).

    Raises:
        InvalidArgumentError: an option is out of range.
    """

    kind = ""

    def __init__(
        self, *, schema: pa.Schema | None, chunk_bytes: int, infer_bytes: int, quote: int | None
    ) -> None:
        if schema is not None and not isinstance(schema, pa.Schema):
            raise InvalidArgumentError(f"schema must be a pyarrow.Schema, got {type(schema)}")
        for name, value in (("chunk_bytes", chunk_bytes), ("infer_bytes", infer_bytes)):
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise InvalidArgumentError(f"{name} must be a positive int, got {value!r}")
        self.given_schema = schema
        self.chunk_bytes = chunk_bytes
        self.infer_bytes = infer_bytes
        self.quote = quote
        # Specs read in this process for options without the plan's (a cache, no plan state).
        self._unplanned: HandleCache[str, TextParsing] = HandleCache(_UNPLANNED)

    # --- what CSV and JSON Lines do differently ------------------------------------------

    def _scanner(self) -> RecordScan:
        raise NotImplementedError

    def _unsplittable(self) -> str | None:
        return None

    def _miscount_causes(self) -> str:
        """Why a chunk may parse to other than the rows the plan's scan counted."""
        return "the file changed since planning"

    def _infer(self, file: ListedFile, fs: FileSystemSpec) -> TextParsing:
        raise NotImplementedError

    def _header(self, data: bytes, file: ListedFile, fs: FileSystemSpec) -> tuple[str, ...]:
        raise NotImplementedError

    def _reader(
        self,
        source: pa.NativeFile,
        spec: TextParsing,
        columns: list[str],
        whole: bool,
        block: int | None = None,
    ) -> Iterator[pa.RecordBatch]:
        """Parse ``source``; ``block``: pyarrow's block size (None: the format's own)."""
        raise NotImplementedError

    def _has_header(self) -> bool:
        return False

    def _check_kind(
        self, head: bytes, complete: bool, file: ListedFile, fs: FileSystemSpec
    ) -> None:
        """Refuse a binary file (Parquet, ORC, Arrow IPC, tar) read as text, from its first
        bytes; the last ones are read only when the first look like Parquet's or ORC's."""
        if complete:
            tail = head[-TAIL_BYTES:]
        elif (head[:4] == b"PAR1" or head[:3] == b"ORC") and compression_of(file.path) is None:
            tail = read_range(file.path, max(0, file.size - TAIL_BYTES), TAIL_BYTES, fs)
        else:
            tail = b""
        check_text(head[:HEAD_BYTES], tail, fs.url(file.path), self.kind)

    # --- planning ------------------------------------------------------------------------

    def schema(self, file: ListedFile, fs: FileSystemSpec) -> pa.Schema:
        if file.size == 0 and self.given_schema is None:
            raise CorruptFileError(
                f"{fs.url(file.path)}: the file is empty (0 bytes): no columns to infer; "
                "pass format_options={'schema': pyarrow.schema([...])}"
            )
        return self._infer(file, fs).schema

    def _scan(self, file: ListedFile, fs: FileSystemSpec, options: ReadOptions) -> _Scanned:
        codec = compression_of(file.path)
        scan = self._scanner()
        header = self._has_header()
        if options.split_rows is None and options.split_bytes is None:
            cutter = ChunkCutter(0, None, self.chunk_bytes)
        else:
            cutter = ChunkCutter(0, options.split_rows, options.split_bytes)
        head: list[bytes] = []  # bytes up to the CSV header's end
        names: tuple[str, ...] | None = None
        for data in read_ranges(file.path, file.size, fs, read_bytes=SCAN_BYTES, codec=codec):
            if scan.offset == 0:  # binary bytes would scan as garbage records
                self._check_kind(data, len(data) < SCAN_BYTES, file, fs)
            ends = scan.feed(data)
            if header and names is None:
                head.append(data)
                if ends.size:
                    names = self._header(b"".join(head)[: int(ends[0])], file, fs)
                    cutter.start = int(ends[0])
                    ends = ends[1:]
            cutter.feed(ends)
        ends = scan.finish()
        if header and names is None and ends.size:  # a header without a newline, no rows
            names = self._header(b"".join(head), file, fs)
            ends = ends[1:]
        cutter.feed(ends)
        unclosed = _unclosed_quote(scan) if self._unsplittable() is None else None
        if unclosed is not None:
            at, what = unclosed
            raise CorruptFileError(
                f"{fs.url(file.path)}: the quote at byte {at}"
                f"{' of the decompressed data' if codec else ''} {what}; close the quote, or "
                "read the file with quote_char=None if its quotes are not quoting"
            )
        why = self._unsplittable() or scan.unreliable
        if why is None and codec is None:
            return _Scanned(names, cutter.finish(file.size), None)
        if codec is not None and why is None:
            rows = cutter.total_rows
        else:  # parity may disagree with the parser: count as the parser does
            rows = self._count_by_parsing(file, fs)
            why = why if codec is None else f"{why}; compressed ({codec})"
        return _Scanned(names, [(0, file.size, rows)] if rows else [], why or f"{codec}")

    def _count_by_parsing(self, file: ListedFile, fs: FileSystemSpec) -> int:
        inferred = self._infer(file, fs)
        names = inferred.names
        first = list(names[:1])  # none only for a given empty JSON schema: rows still count
        # Strings: counting must not fail on a value the planned types refuse (read does).
        spec = TextParsing(
            names,
            pa.schema([(n, pa.string()) for n in first]),
            inferred=False,
            file_names=inferred.file_names,
        )
        chunk = Chunk(file.path, 0, file.size, 0, file.size)
        return sum(b.num_rows for b in self._batches(chunk, fs, spec, first))

    def plan(self, listing: Listing, fs: FileSystemSpec, options: ReadOptions) -> FormatPlan:
        files = listing.files
        nonempty = [f for f in files if f.size]
        scans = each_file(lambda f: self._scan(f, fs, options), nonempty, threads=SCAN_THREADS)
        scanned = dict(zip([f.path for f in nonempty], scans, strict=True))
        reference = next((f for f in nonempty if scanned[f.path].chunks), None)
        if reference is None:  # no rows anywhere: the schema of the first file with bytes
            reference = nonempty[0] if nonempty else files[0]
        spec = self._infer(reference, fs)
        self._check_headers(files, scanned, spec, reference, fs)
        for f in files:  # once per file read under new names
            found = scanned[f.path].names if f.path in scanned else None
            warn_renamed(fs.url(f.path), found or spec.file_names, stacklevel=4)
        schema = check_schemas(
            files,
            [FileSchema(spec.schema, bool(scanned.get(f.path, _EMPTY).chunks)) for f in files],
            fs,
            options,
        )
        chunks: list[Chunk] = []
        rows = size = 0
        for f, partition in zip(files, listing.partitions, strict=True):
            for start, stop, n in scanned.get(f.path, _EMPTY).chunks:
                chunks.append(Chunk(f.path, start, stop, n, stop - start, (), partition))
                rows += n
                size += stop - start
        return FormatPlan(
            chunks=chunks,
            schema=schema,
            row_bytes=max(1.0, size / max(1, rows)),
            read_options=TextReadOptions.of(options, specs={f.path: spec for f in files}),
        )

    def _check_headers(
        self,
        files: Sequence[ListedFile],
        scanned: dict[str, _Scanned],
        spec: TextParsing,
        reference: ListedFile,
        fs: FileSystemSpec,
    ) -> None:
        if not self._has_header():
            return
        for f in files:
            names = scanned[f.path].names if f.path in scanned else None
            if names is not None and unique_names(names) != spec.names:
                raise SchemaMismatchError(
                    f"{fs.url(f.path)} and {fs.url(reference.path)} disagree on the header: "
                    f"{list(names)} vs {list(spec.file_names or spec.names)}"
                )

    # --- reading -------------------------------------------------------------------------

    def _spec(self, path: str, fs: FileSystemSpec, options: ReadOptions) -> TextParsing:
        """The plan's `TextParsing` of ``path``; without one (options not from this format's plan),
        the given schema's, with the names read from the file."""
        spec = options.spec_of(path) if isinstance(options, TextReadOptions) else None
        if spec is not None:
            return spec
        if self.given_schema is None:
            raise InvalidArgumentError(
                f"{fs.url(path)}: {type(self).__name__} reads a file without its plan's read "
                "options, so its column types are unknown (they are inferred once, when "
                "planning, and travel in the plan's TextReadOptions); read with the plan's "
                "read_options, or pass format_options={'schema': pyarrow.schema([...])}"
            )
        return self._unplanned.get(
            path, lambda: self._infer(ListedFile(path, fs.file_size(path), ""), fs)
        )

    def _source(self, chunk: Chunk, fs: FileSystemSpec) -> pa.NativeFile:
        codec = compression_of(chunk.path)
        if codec is not None:
            return open_decompressed(chunk.path, codec, fs)
        size = chunk.stop - chunk.start
        if fs.is_local:  # a native stream: nothing Python-owned reaches Arrow's threads, no copy
            return open_input(chunk.path, fs).get_stream(chunk.start, size)
        if size <= _READ_BYTES:
            return pa.BufferReader(arrow_owned(read_range(chunk.path, chunk.start, size, fs)))
        return pa.PythonFile(_RangeStream(chunk.path, chunk.start, chunk.stop, fs), mode="r")

    def _batches(
        self, chunk: Chunk, fs: FileSystemSpec, spec: TextParsing, columns: list[str]
    ) -> Iterator[pa.RecordBatch]:
        where = f"{fs.url(chunk.path)} bytes {chunk.start}-{chunk.stop}"
        block: int | None = None  # the format's own, until a record does not fit in it
        done = 0  # rows yielded: a parse started again skips them
        while True:
            source = self._source(chunk, fs)
            try:
                with parsing(where, kind=f"valid {self.kind}"):
                    try:
                        pos = 0
                        for batch in self._reader(source, spec, columns, chunk.start == 0, block):
                            if pos + batch.num_rows > done:
                                yield batch.slice(max(done - pos, 0))
                                done = pos + batch.num_rows
                            pos += batch.num_rows
                        return
                    except pa.ArrowInvalid as exc:
                        # A record longer than pyarrow's block: parse again with a block that
                        # holds the whole chunk (its bytes are read whole anyway).
                        whole_chunk = chunk.stop - chunk.start + 1
                        if "straddl" in str(exc) and (block or 0) < whole_chunk:
                            block = whole_chunk
                            continue
                        raise self._bad_value(exc, chunk, fs, spec, where) from exc
            finally:
                source.close()

    def _bad_value(
        self, exc: pa.ArrowInvalid, chunk: Chunk, fs: FileSystemSpec, spec: TextParsing, where: str
    ) -> CorruptFileError:
        advice = (
            "; the column types were fixed when planning (inferred from the first "
            f"{self.infer_bytes} bytes of the first file with rows): if the value is right, "
            "pass format_options={'schema': pyarrow.schema([...])} with a type that holds it"
            if spec.inferred
            else ""
        )
        return CorruptFileError(f"{where}: not valid {self.kind} ({exc}){advice}")

    def read(
        self,
        chunk: Chunk,
        row_start: int,
        row_stop: int,
        fs: FileSystemSpec,
        options: ReadOptions,
    ) -> Iterator[pa.RecordBatch]:
        if row_start >= row_stop:
            return
        spec = self._spec(chunk.path, fs, options)
        columns = list(options.columns) if options.columns is not None else spec.schema.names
        # No columns (a count): read the first one and drop it, so batches keep their length.
        parsed = columns or spec.schema.names[:1]
        pos = 0
        for batch in self._batches(chunk, fs, spec, parsed):
            lo, hi = max(row_start, pos), min(row_stop, pos + batch.num_rows)
            if lo < hi:
                out = batch.slice(lo - pos, hi - lo)
                if spec.empty_is_null:
                    out = _null_strings(out, spec.empty_is_null, spec.null_values)
                yield out if columns else out.select([])
            pos += batch.num_rows
            # Reading up to the chunk's end parses all of it: check the planned count.
            if pos >= row_stop and row_stop < chunk.num_rows:
                return
        if pos != chunk.num_rows:
            raise CorruptFileError(
                f"{fs.url(chunk.path)} bytes {chunk.start}-{chunk.stop}: the chunk parsed to "
                f"{pos} rows where the plan counted {chunk.num_rows}; likely causes: "
                f"{self._miscount_causes()}"
            )


_EMPTY = _Scanned(None, [], None)


def _null_strings(
    batch: pa.RecordBatch, names: tuple[str, ...], null_values: tuple[str, ...]
) -> pa.RecordBatch:
    """Columns ``names`` of ``batch`` with their ``null_values`` made null, as pyarrow reads a
    column it infers as null (read as string here, so that later values fit)."""
    values = pa.array(null_values, pa.string())
    for name in names:
        i = batch.schema.get_field_index(name)
        if i >= 0:
            column = batch.column(i)
            hit = pc.is_in(column, value_set=values)
            batch = batch.set_column(
                i, batch.schema.field(i), pc.if_else(hit, pa.scalar(None, column.type), column)
            )
    return batch
