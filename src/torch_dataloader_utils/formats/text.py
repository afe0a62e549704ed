"""CSV and JSON Lines: chunks are byte ranges cut at record starts, counted at plan time.

Planning scans every file once (threads across files, ~8 MiB range reads, numpy finds the
newlines; see `records`) to cut it into chunks of about ``block_bytes`` (or ``split_bytes`` /
``split_rows``) and count each chunk's rows exactly: the equal-stream model needs the counts.
Column types are fixed once at plan time (inferred from the first ``infer_bytes`` of the first
file with rows, or given as ``schema=``), and every chunk is parsed with those EXPLICIT types:
inference per chunk drifts (``1,`` infers null in one chunk, int64 in another).

Files that cannot be cut safely are one chunk each, their rows counted by a full parse at plan
time and skipped to ``row_start`` by parsing when read: compressed files (``.gz``, ``.bz2``,
``.zst``, ``.lz4``, ``.xz``), CSV with ``escape_char``, and CSV files where quote parity may
disagree with pyarrow's parser (see `records.RecordScan`).
"""

from __future__ import annotations

import io
import re
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.json as pajson

from ..errors import CorruptFileError, InvalidArgumentError, SchemaMismatchError, StorageError
from ..fs import FileSystemSpec, SourceFile, translate_os_error
from ..planning import Chunk
from .base import Format, FormatPlan, ReadOptions
from .opening import parsing
from .records import ChunkCutter, RecordScan, compression_of, open_decompressed, read_pieces
from .schemas import FileSchema, check_schemas

__all__ = ["CsvFormat", "JsonFormat"]

_PLAN_THREADS = 16
_SCAN_PIECE = 8 << 20  # bytes per plan-time range read
_READ_PIECE = 32 << 20  # a chunk up to this size is fetched in one request
_CSV_BLOCK = 1 << 20  # pyarrow's CSV block: small, so a read of a chunk's first rows stops early
_JSON_BLOCK = 16 << 20  # a JSON block must hold whole lines


@dataclass(frozen=True)
class _Layout:
    """What reading a file needs from planning: its column names in file order (CSV) and
    the types every chunk is parsed with."""

    names: tuple[str, ...]
    schema: pa.Schema
    inferred: bool


@dataclass(frozen=True)
class _Scanned:
    names: tuple[str, ...] | None  # the CSV header's names (None: no header or no bytes)
    chunks: list[tuple[int, int, int]]
    unsplit: str | None  # why the file is one chunk


class _RangeStream(io.RawIOBase):
    """Bytes ``[start, stop)`` of a file, fetched in `_READ_PIECE` range reads as pyarrow's
    streaming reader asks for them."""

    def __init__(self, path: str, start: int, stop: int, fs: FileSystemSpec) -> None:
        self.path, self.pos, self.stop, self.fs = path, start, stop, fs
        self.buffer = memoryview(b"")

    def readable(self) -> bool:
        return True

    def readinto(self, b: Any) -> int:
        if not self.buffer and self.pos < self.stop:
            size = min(_READ_PIECE, self.stop - self.pos)
            self.buffer = memoryview(_read_range(self.path, self.pos, size, self.fs))
            self.pos += size
        n = min(len(b), len(self.buffer))
        b[:n] = self.buffer[:n]
        self.buffer = self.buffer[n:]
        return n


def _read_range(path: str, offset: int, size: int, fs: FileSystemSpec) -> bytes:
    try:
        return fs.read_range(path, offset, size)
    except OSError as exc:
        raise translate_os_error(exc, fs.url(path)) from exc


class _TextFormat(Format):
    """What CSV and JSON Lines share: the plan-time scan, chunk sources, row slicing."""

    kind = ""

    def __init__(
        self, *, schema: pa.Schema | None, block_bytes: int, infer_bytes: int, quote: int | None
    ) -> None:
        if schema is not None and not isinstance(schema, pa.Schema):
            raise InvalidArgumentError(f"schema must be a pyarrow.Schema, got {type(schema)}")
        for name, value in (("block_bytes", block_bytes), ("infer_bytes", infer_bytes)):
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise InvalidArgumentError(f"{name} must be a positive int, got {value!r}")
        self.given_schema = schema
        self.block_bytes = block_bytes
        self.infer_bytes = infer_bytes
        self.quote = quote
        # Layouts fixed by `plan`, by file: they travel with the format into workers.
        self._layouts: dict[str, _Layout] = {}

    # --- what CSV and JSON Lines do differently ------------------------------------------

    def _scanner(self) -> RecordScan:
        raise NotImplementedError

    def _unsplittable(self) -> str | None:
        return None

    def _infer(self, file: SourceFile, fs: FileSystemSpec) -> _Layout:
        raise NotImplementedError

    def _header(self, data: bytes, file: SourceFile, fs: FileSystemSpec) -> tuple[str, ...]:
        raise NotImplementedError

    def _reader(
        self, source: pa.NativeFile, layout: _Layout, columns: list[str], whole: bool
    ) -> Iterator[pa.RecordBatch]:
        raise NotImplementedError

    def _has_header(self) -> bool:
        return False

    # --- planning ------------------------------------------------------------------------

    def schema(self, file: SourceFile, fs: FileSystemSpec) -> pa.Schema:
        if file.size == 0 and self.given_schema is None:
            raise CorruptFileError(
                f"{fs.url(file.path)}: the file is empty (0 bytes): no columns to infer; "
                "pass format_options={'schema': pyarrow.schema([...])}"
            )
        return self._infer(file, fs).schema

    def _scan(self, file: SourceFile, fs: FileSystemSpec, options: ReadOptions) -> _Scanned:
        codec = compression_of(file.path)
        scan = self._scanner()
        header = self._has_header()
        if options.split_rows is None and options.split_bytes is None:
            cutter = ChunkCutter(0, None, self.block_bytes)
        else:
            cutter = ChunkCutter(0, options.split_rows, options.split_bytes)
        head: list[bytes] = []  # bytes up to the CSV header's end
        names: tuple[str, ...] | None = None
        for piece in read_pieces(file.path, file.size, fs, piece=_SCAN_PIECE, codec=codec):
            ends = scan.feed(piece)
            if header and names is None:
                head.append(piece)
                if ends.size:
                    names = self._header(b"".join(head)[: int(ends[0])], file, fs)
                    cutter.start = cutter.last_end = int(ends[0])
                    ends = ends[1:]
            cutter.feed(ends)
        ends = scan.finish()
        if header and names is None and ends.size:  # a header without a newline, no rows
            names = self._header(b"".join(head), file, fs)
            ends = ends[1:]
        cutter.feed(ends)
        why = self._unsplittable() or scan.unreliable
        if why is None and codec is None:
            return _Scanned(names, cutter.finish(file.size), None)
        if codec is not None and why is None:
            rows = cutter.total_rows
        else:  # parity may disagree with the parser: count as the parser does
            rows = self._count_by_parsing(file, fs)
            why = why if codec is None else f"{why}; compressed ({codec})"
        return _Scanned(names, [(0, file.size, rows)] if rows else [], why or f"{codec}")

    def _count_by_parsing(self, file: SourceFile, fs: FileSystemSpec) -> int:
        names = self._infer(file, fs).names
        # Strings: counting must not fail on a value the planned types refuse (read does).
        layout = _Layout(names, pa.schema([(names[0], pa.string())]), inferred=False)
        chunk = Chunk(file.path, 0, file.size, 0, file.size)
        return sum(b.num_rows for b in self._batches(chunk, fs, layout, [names[0]]))

    def plan(
        self,
        files: Sequence[SourceFile],
        partitions: Sequence[tuple[tuple[str, object], ...]],
        fs: FileSystemSpec,
        options: ReadOptions,
    ) -> FormatPlan:
        nonempty = [f for f in files if f.size]
        threads = max(1, min(_PLAN_THREADS, len(nonempty)))
        with ThreadPoolExecutor(threads, thread_name_prefix="tdu-plan") as pool:
            scanned = dict(
                zip(
                    [f.path for f in nonempty],
                    pool.map(lambda f: self._scan(f, fs, options), nonempty),
                    strict=True,
                )
            )
        reference = next((f for f in nonempty if scanned[f.path].chunks), None)
        if reference is None:  # no rows anywhere: the schema of the first file with bytes
            reference = nonempty[0] if nonempty else files[0]
        layout = self._infer(reference, fs)
        self._check_headers(files, scanned, layout, reference, fs)
        schema = check_schemas(
            files,
            [FileSchema(layout.schema, bool(scanned.get(f.path, _EMPTY).chunks)) for f in files],
            fs,
            options,
        )
        chunks: list[Chunk] = []
        rows = size = 0
        for f, partition in zip(files, partitions, strict=True):
            self._layouts[f.path] = layout
            for start, stop, n in scanned.get(f.path, _EMPTY).chunks:
                chunks.append(Chunk(f.path, start, stop, n, stop - start, (), partition))
                rows += n
                size += stop - start
        return FormatPlan(chunks=chunks, schema=schema, row_bytes=max(1.0, size / max(1, rows)))

    def _check_headers(
        self,
        files: Sequence[SourceFile],
        scanned: dict[str, _Scanned],
        layout: _Layout,
        reference: SourceFile,
        fs: FileSystemSpec,
    ) -> None:
        if not self._has_header():
            return
        for f in files:
            names = scanned[f.path].names if f.path in scanned else None
            if names is not None and names != layout.names:
                raise SchemaMismatchError(
                    f"{fs.url(f.path)} and {fs.url(reference.path)} disagree on the header: "
                    f"{list(names)} vs {list(layout.names)}"
                )

    # --- reading -------------------------------------------------------------------------

    def _layout(self, path: str, fs: FileSystemSpec) -> _Layout:
        layout = self._layouts.get(path)
        if layout is not None:
            return layout
        if self.given_schema is None:
            raise InvalidArgumentError(
                f"{fs.url(path)}: {type(self).__name__} reads a file it did not plan, so its "
                "column types are unknown (they are inferred once, when planning); pass "
                "format_options={'schema': pyarrow.schema([...])}"
            )
        layout = self._infer(SourceFile(path, 0, ""), fs)
        self._layouts[path] = layout
        return layout

    def _source(self, chunk: Chunk, fs: FileSystemSpec) -> pa.NativeFile:
        codec = compression_of(chunk.path)
        if codec is not None:
            return open_decompressed(chunk.path, codec, fs)
        size = chunk.stop - chunk.start
        if size <= _READ_PIECE:
            return pa.BufferReader(_read_range(chunk.path, chunk.start, size, fs))
        return pa.PythonFile(_RangeStream(chunk.path, chunk.start, chunk.stop, fs), mode="r")

    def _batches(
        self, chunk: Chunk, fs: FileSystemSpec, layout: _Layout, columns: list[str]
    ) -> Iterator[pa.RecordBatch]:
        where = f"{fs.url(chunk.path)} bytes {chunk.start}-{chunk.stop}"
        source = self._source(chunk, fs)
        try:
            with parsing(where, kind=f"valid {self.kind}"):
                try:
                    yield from self._reader(source, layout, columns, chunk.start == 0)
                except pa.ArrowInvalid as exc:
                    raise self._bad_value(exc, chunk, fs, layout, where) from exc
        finally:
            source.close()

    def _bad_value(
        self, exc: pa.ArrowInvalid, chunk: Chunk, fs: FileSystemSpec, layout: _Layout, where: str
    ) -> CorruptFileError:
        advice = (
            "; the column types were fixed when planning (inferred from the first "
            f"{self.infer_bytes} bytes of the first file with rows): if the value is right, "
            "pass format_options={'schema': pyarrow.schema([...])} with a type that holds it"
            if layout.inferred
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
        layout = self._layout(chunk.path, fs)
        columns = list(options.columns) if options.columns is not None else layout.schema.names
        # No columns (a count): read the first one and drop it, so batches keep their length.
        parsed = columns or [layout.schema.names[0]]
        pos = 0
        for batch in self._batches(chunk, fs, layout, parsed):
            lo, hi = max(row_start, pos), min(row_stop, pos + batch.num_rows)
            if lo < hi:
                out = batch.slice(lo - pos, hi - lo)
                yield out if columns else out.select([])
            pos += batch.num_rows
            # Reading up to the chunk's end parses all of it: check the planned count.
            if pos >= row_stop and row_stop < chunk.num_rows:
                return
        if pos != chunk.num_rows:
            raise CorruptFileError(
                f"{fs.url(chunk.path)} bytes {chunk.start}-{chunk.stop}: parsed {pos} rows, "
                f"planning counted {chunk.num_rows} (the file changed since planning, or "
                "records hold newlines the plan did not expect)"
            )


_EMPTY = _Scanned(None, [], None)
_CONVERSION = re.compile(
    r"In CSV column #(\d+):(?: Row #\d+:)? CSV conversion error to (.+?): invalid value '(.*)'"
)


def _head(file: SourceFile, fs: FileSystemSpec, size: int, codec: str | None) -> tuple[bytes, bool]:
    """The first ``size`` bytes of ``file`` (decompressed), and whether that is all of it."""
    if codec is None:
        n = min(file.size, size)
        return (_read_range(file.path, 0, n, fs) if n else b""), n == file.size
    stream = open_decompressed(file.path, codec, fs)
    try:
        with parsing(fs.url(file.path), kind=f"a readable {codec} file"):
            data = bytes(stream.read(size))
            return data, len(data) < size or not stream.read(1)
    finally:
        stream.close()


def _one_byte(name: str, value: object, *, optional: bool) -> int | None:
    if value is None or value is False:
        if optional:
            return None
        raise InvalidArgumentError(f"{name} is required")
    if not isinstance(value, str) or len(value.encode()) != 1:
        raise InvalidArgumentError(f"{name} must be one single-byte character, got {value!r}")
    return value.encode()[0]


class CsvFormat(_TextFormat):
    """CSV files: byte-range chunks cut at record starts, quote-aware.

    Args:
        delimiter: the field delimiter.
        quote_char: the quote character; ``None`` turns quoting off.
        escape_char: an escape character inside quoted values; with one, files are not cut
            (quote parity cannot find record boundaries): one chunk per file.
        header: whether the first line holds the column names (every file's must agree).
        column_names: the names of the columns, with ``header=False``; without them they are
            ``f0, f1, ...`` (as pyarrow names them).
        schema: the columns and their types; by default inferred once from the first
            ``infer_bytes`` of the first file with rows (a column with no values there is read
            as string). With a header, every field must be a header column; other header
            columns are not read.
        null_values: strings read as null (pyarrow's list by default).
        block_bytes: bytes per chunk without ``split_bytes``/``split_rows``.
        infer_bytes: bytes the types are inferred from.
        newlines_in_values: ``False`` asserts that no quoted value holds a newline: records
            are cut at every newline, with no quote-parity scan (planning scans ~2x faster);
            a chunk that then parses to another row count than planned raises
            `CorruptFileError`. By default (``None``) record boundaries are found by quote
            parity, and chunks are parsed with pyarrow's ``newlines_in_values=True`` (measured
            no slower).

    Raises:
        InvalidArgumentError: an option is out of range.
    """

    name = "csv"
    kind = "CSV"

    def __init__(
        self,
        *,
        delimiter: str = ",",
        quote_char: str | None = '"',
        escape_char: str | None = None,
        header: bool = True,
        column_names: Sequence[str] | None = None,
        schema: pa.Schema | None = None,
        null_values: Sequence[str] | None = None,
        block_bytes: int = 16 << 20,
        infer_bytes: int = 1 << 20,
        newlines_in_values: bool | None = None,
    ) -> None:
        self.delimiter = delimiter
        self.delimiter_byte = _one_byte("delimiter", delimiter, optional=False)
        quote = _one_byte("quote_char", quote_char, optional=True)
        self.quote_char = quote_char if quote is not None else None
        self.escape_char = (
            escape_char if _one_byte("escape_char", escape_char, optional=True) else None
        )
        if header and column_names is not None:
            raise InvalidArgumentError("column_names= goes with header=False")
        self.header = bool(header)
        self.column_names = tuple(column_names) if column_names is not None else None
        self.null_values = list(null_values) if null_values is not None else None
        self.newlines_in_values = newlines_in_values
        super().__init__(
            schema=schema,
            block_bytes=block_bytes,
            infer_bytes=infer_bytes,
            quote=quote if newlines_in_values is not False else None,
        )

    def _has_header(self) -> bool:
        return self.header

    def _unsplittable(self) -> str | None:
        return "an escape_char is set" if self.escape_char is not None else None

    def _scanner(self) -> RecordScan:
        return RecordScan(
            quote=self.quote,
            delimiter=self.delimiter_byte,
            blank=b"\r",
            bare_cr_ends_records=True,
        )

    def _parse_options(self, newlines: bool) -> pacsv.ParseOptions:
        return pacsv.ParseOptions(
            delimiter=self.delimiter,
            quote_char=self.quote_char if self.quote_char is not None else False,
            escape_char=self.escape_char if self.escape_char is not None else False,
            newlines_in_values=newlines,
        )

    def _convert(self, types: dict[str, pa.DataType], columns: list[str]) -> pacsv.ConvertOptions:
        kwargs: dict[str, Any] = {"column_types": types, "include_columns": columns}
        if self.null_values is not None:
            kwargs["null_values"] = self.null_values
        return pacsv.ConvertOptions(**kwargs)

    def _header(self, data: bytes, file: SourceFile, fs: FileSystemSpec) -> tuple[str, ...]:
        with parsing(f"{fs.url(file.path)} header", kind="a CSV header"):
            table = pacsv.read_csv(
                pa.BufferReader(data + b"\n"),
                read_options=pacsv.ReadOptions(use_threads=False),
                parse_options=self._parse_options(True),
            )
        return tuple(table.schema.names)

    def _infer(self, file: SourceFile, fs: FileSystemSpec) -> _Layout:
        url = fs.url(file.path)
        given = self.given_schema
        if given is not None and not self.header:
            names = self.column_names or tuple(given.names)
            return _Layout(tuple(names), given, inferred=False)
        codec = compression_of(file.path)
        if codec is not None:
            source = open_decompressed(file.path, codec, fs)
        else:
            try:
                source = fs.request(lambda: fs.arrow().open_input_stream(file.path), what=url)
            except OSError as exc:
                raise translate_os_error(exc, url) from exc
        try:
            with parsing(url, kind="valid CSV"):
                reader = pacsv.open_csv(
                    source,
                    read_options=self._read_options(
                        self.infer_bytes, whole=True, names=self.column_names
                    ),
                    parse_options=self._parse_options(self.newlines_in_values is not False),
                    convert_options=self._convert({}, []),
                )
                schema = reader.schema
        finally:
            source.close()
        names = tuple(schema.names)
        if given is not None:
            missing = [n for n in given.names if n not in names]
            if missing:
                raise SchemaMismatchError(
                    f"{url}: the schema's column(s) {missing} are not in the header {list(names)}"
                )
            return _Layout(names, given, inferred=False)
        # A column without values in the sample infers as null; string holds anything.
        fields = [f.with_type(pa.string()) if pa.types.is_null(f.type) else f for f in schema]
        return _Layout(names, pa.schema(fields), inferred=True)

    def _read_options(
        self, block: int, *, whole: bool, names: Sequence[str] | None
    ) -> pacsv.ReadOptions:
        """``whole``: the bytes start at the file's start, where pyarrow reads the header."""
        if self.header and whole:
            return pacsv.ReadOptions(use_threads=False, block_size=block)
        if names is None:
            return pacsv.ReadOptions(
                use_threads=False, block_size=block, autogenerate_column_names=True
            )
        return pacsv.ReadOptions(use_threads=False, block_size=block, column_names=list(names))

    def _reader(
        self, source: pa.NativeFile, layout: _Layout, columns: list[str], whole: bool
    ) -> Iterator[pa.RecordBatch]:
        types = {f.name: f.type for f in layout.schema}
        reader = pacsv.open_csv(
            source,
            read_options=self._read_options(_CSV_BLOCK, whole=whole, names=layout.names),
            parse_options=self._parse_options(self.newlines_in_values is not False),
            convert_options=self._convert(types, columns),
        )
        yield from reader

    def _bad_value(
        self, exc: pa.ArrowInvalid, chunk: Chunk, fs: FileSystemSpec, layout: _Layout, where: str
    ) -> CorruptFileError:
        found = _CONVERSION.search(str(exc))
        if found is None:
            return super()._bad_value(exc, chunk, fs, layout, where)
        index, type_name, value = int(found[1]), found[2], found[3]
        column = layout.names[index] if index < len(layout.names) else f"#{index}"
        try:
            at = self._locate(chunk, fs, layout, column, value)
        except (CorruptFileError, StorageError, pa.ArrowException):
            at = ""  # the error at hand says enough; locating it is a courtesy
        advice = (
            f"; {column!r} was inferred as {type_name} from the first {self.infer_bytes} bytes "
            "of the first file with rows: pass format_options={'schema': pyarrow.schema([...])} "
            "with a type that holds this value (pyarrow.string() holds any)"
            if layout.inferred
            else ""
        )
        return CorruptFileError(
            f"{where}: column {column!r}: value {value!r}{at} is not a valid {type_name}{advice}"
        )

    def _locate(
        self, chunk: Chunk, fs: FileSystemSpec, layout: _Layout, column: str, value: str
    ) -> str:
        """Where ``value`` first occurs in ``column`` of ``chunk``: its byte offset when the
        chunk's bytes can be scanned for record boundaries, else its row."""
        strings = _Layout(layout.names, pa.schema([(column, pa.string())]), inferred=False)
        row = 0
        for batch in self._batches(chunk, fs, strings, [column]):
            hits = [i for i, v in enumerate(batch.column(0).to_pylist()) if v == value]
            if hits:
                row += hits[0]
                break
            row += batch.num_rows
        else:
            return ""
        whole = chunk.start == 0 and self.header
        if compression_of(chunk.path) is not None or (whole and self.escape_char is not None):
            return f" (row {row} of the file's data)"
        scan = self._scanner()
        scan.offset = chunk.start
        ends: list[int] = []
        wanted = row + (1 if whole else 0)  # the header is a record too
        for offset in range(chunk.start, chunk.stop, _SCAN_PIECE):
            size = min(_SCAN_PIECE, chunk.stop - offset)
            ends.extend(scan.feed(_read_range(chunk.path, offset, size, fs)).tolist())
            if len(ends) >= wanted:
                break
        return f" at byte {ends[wanted - 1] if wanted else chunk.start} (row {row} of the chunk)"

    def __repr__(self) -> str:
        return f"CsvFormat(delimiter={self.delimiter!r}, header={self.header})"


class JsonFormat(_TextFormat):
    """JSON Lines: one JSON object per line; byte-range chunks cut at newlines (a raw newline
    cannot occur inside a JSON string, so every line feed ends a record). Blank lines are not
    records; a field missing in a line reads as null.

    Args:
        schema: the fields and their types; by default inferred once from the first
            ``infer_bytes`` of the first file with rows, and then a field not in it is an
            error (pass ``schema=``); with ``schema=``, other fields are ignored.
        block_bytes: bytes per chunk without ``split_bytes``/``split_rows``.
        infer_bytes: bytes the types are inferred from.

    Raises:
        InvalidArgumentError: an option is out of range.
    """

    name = "json"
    kind = "JSON Lines"

    def __init__(
        self,
        *,
        schema: pa.Schema | None = None,
        block_bytes: int = 16 << 20,
        infer_bytes: int = 1 << 20,
    ) -> None:
        super().__init__(
            schema=schema, block_bytes=block_bytes, infer_bytes=infer_bytes, quote=None
        )

    def _scanner(self) -> RecordScan:
        return RecordScan(quote=None, delimiter=None, blank=b" \t\r", bare_cr_ends_records=False)

    def _infer(self, file: SourceFile, fs: FileSystemSpec) -> _Layout:
        if self.given_schema is not None:
            return _Layout(tuple(self.given_schema.names), self.given_schema, inferred=False)
        codec = compression_of(file.path)
        block = self.infer_bytes
        while True:  # the sample holds whole lines: grow it until one fits
            head, complete = _head(file, fs, block, codec)
            cut = head.rfind(b"\n") + 1 if not complete else len(head)
            if cut == 0:
                block *= 4
                continue
            if not head[:cut].strip():
                return _Layout((), pa.schema([]), inferred=True)  # no records
            with parsing(fs.url(file.path), kind="valid JSON Lines"):
                schema = pajson.read_json(
                    pa.BufferReader(head[:cut]),
                    read_options=pajson.ReadOptions(use_threads=False, block_size=cut + 1),
                ).schema
            return _Layout(tuple(schema.names), schema, inferred=True)

    def _reader(
        self, source: pa.NativeFile, layout: _Layout, columns: list[str], whole: bool
    ) -> Iterator[pa.RecordBatch]:
        size = source.size() if isinstance(source, pa.BufferReader) else 0
        reader = pajson.open_json(
            source,
            read_options=pajson.ReadOptions(
                use_threads=False, block_size=max(size + 1, _JSON_BLOCK)
            ),
            parse_options=pajson.ParseOptions(
                explicit_schema=layout.schema,
                unexpected_field_behavior="error" if layout.inferred else "ignore",
            ),
        )
        for batch in reader:
            yield batch.select(columns)

    def __repr__(self) -> str:
        return "JsonFormat()"
