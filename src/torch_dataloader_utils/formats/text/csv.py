"""CSV: byte-range chunks cut at record starts found by quote parity (see `format`)."""

from __future__ import annotations

import codecs
import dataclasses
import re
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import pyarrow as pa
import pyarrow.csv as pacsv

from ...errors import (
    CorruptFileError,
    DataError,
    InvalidArgumentError,
    SchemaMismatchError,
    StorageError,
    UnsupportedFileError,
)
from ...fs import FileSystemSpec, ListedFile
from ...planning import Chunk
from ..base import ReadOptions
from ..names import unique_names
from ..opening import arrow_owned, parsing, read_range
from ..records import RecordScan, compression_of, read_head
from .format import SCAN_BYTES, TextFormat, TextParsing, text_chunk_bytes

__all__ = ["CsvFormat"]

_CSV_BLOCK = 1 << 20  # pyarrow's CSV block: small, so a read of a chunk's first rows stops early
_NULL_VALUES = tuple(pacsv.ConvertOptions().null_values)  # pyarrow's, for inferred types
_LINES_UP_TO = 256 << 20  # an error's line number is counted through at most this many bytes
_CONVERSION = re.compile(
    r"In CSV column #(\d+):(?: Row #\d+:)? CSV conversion error to (.+?): invalid value '(.*)'"
)
# pyarrow's one error for text that is not UTF-8 (after transcoding from `encoding`): an
# ArrowInvalid like every other, told apart by its message alone.
_NOT_UTF8 = re.compile(
    r"In CSV column #(\d+):(?: Row #\d+:)? CSV conversion error to .+?: invalid UTF8"
)


def _one_byte(name: str, value: object, *, optional: bool) -> int | None:
    if value is None or value is False:
        if optional:
            return None
        raise InvalidArgumentError(f"{name} is required")
    if not isinstance(value, str) or len(value.encode()) != 1:
        raise InvalidArgumentError(f"{name} must be one single-byte character, got {value!r}")
    return value.encode()[0]


class CsvFormat(TextFormat):
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
        chunk_bytes: bytes per chunk without ``split_bytes``/``split_rows`` (default 16 MiB).
        infer_bytes: bytes the types are inferred from.
        newlines_in_values: ``False`` asserts that no quoted value holds a newline: records
            are cut at every newline, with no quote-parity scan (planning scans ~2x faster);
            a chunk that then parses to another row count than planned raises
            `CorruptFileError`. By default (``None``) record boundaries are found by quote
            parity, and chunks are parsed with pyarrow's ``newlines_in_values=True`` (measured
            no slower).
        encoding: the files' text encoding; pyarrow transcodes it to UTF-8 while parsing.
            It must keep ASCII bytes as they are (UTF-8, Latin-1, cp1252, Shift-JIS do;
            UTF-16 does not).
        block_bytes: the earlier name of ``chunk_bytes``, accepted for a release with a
            `DeprecationWarning`.

    Raises:
        InvalidArgumentError: an option is out of range, or both ``chunk_bytes`` and
            ``block_bytes`` are given.
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
        chunk_bytes: int | None = None,
        infer_bytes: int = 1 << 20,
        newlines_in_values: bool | None = None,
        encoding: str = "utf8",
        block_bytes: int | None = None,
    ) -> None:
        self.encoding = _ascii_compatible(encoding)
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
            chunk_bytes=text_chunk_bytes("CsvFormat", chunk_bytes, block_bytes),
            infer_bytes=infer_bytes,
            quote=quote if newlines_in_values is not False else None,
        )

    def _has_header(self) -> bool:
        return self.header

    def _unsplittable(self) -> str | None:
        return "an escape_char is set" if self.escape_char is not None else None

    def _miscount_causes(self) -> str:
        if self.newlines_in_values is False:
            return (
                "a quoted value holding a newline while newlines_in_values=False (leave it "
                "unset), or the file changed since planning"
            )
        return "the file changed since planning"

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

    def _header(self, data: bytes, file: ListedFile, fs: FileSystemSpec) -> tuple[str, ...]:
        with parsing(f"{fs.url(file.path)} header", kind="a CSV header"):
            table = pacsv.read_csv(
                pa.BufferReader(arrow_owned(data + b"\n")),
                read_options=pacsv.ReadOptions(use_threads=False, encoding=self.encoding),
                parse_options=self._parse_options(True),
            )
        return self._names(table.schema, fs.url(file.path))

    def _names(self, schema: pa.Schema, url: str) -> tuple[str, ...]:
        try:
            return tuple(schema.names)
        except UnicodeDecodeError as exc:
            raise DataError(
                f"{url}: the header's column names are not {_named(self.encoding)} ({exc}); pass "
                "format_options={'encoding': ...} with the file's encoding (e.g. 'latin-1', "
                "'cp1252', 'shift_jis'): pyarrow transcodes it to UTF-8"
            ) from None

    def _infer(self, file: ListedFile, fs: FileSystemSpec) -> TextParsing:
        url = fs.url(file.path)
        given = self.given_schema
        if given is not None and not self.header:
            names = unique_names(self.column_names or tuple(given.names))
            return TextParsing(names, given, inferred=False)
        # The first block pyarrow infers from is the first `infer_bytes`; twice that lets a
        # record cut there end. Read here, not streamed: pyarrow's reader would read ahead of
        # the block on its IO threads (up to 32 blocks), past what inference needs.
        head, complete = read_head(file.path, file.size, fs, 2 * self.infer_bytes)
        self._check_kind(head, complete, file, fs)
        with parsing(url, kind="valid CSV"):
            reader = pacsv.open_csv(
                pa.BufferReader(arrow_owned(head)),
                read_options=self._read_options(
                    self.infer_bytes, whole=True, names=self.column_names
                ),
                parse_options=self._parse_options(self.newlines_in_values is not False),
                convert_options=self._convert({}, []),
            )
            schema = reader.schema
            reader.close()
        raw = self._names(schema, url)
        names = unique_names(raw)
        renamed = raw if names != raw else ()
        if renamed and head[:1] in (b"\n", b"\r"):
            # New names skip the header's line by count, and pyarrow counts an empty one.
            raise UnsupportedFileError(
                f"{url}: the header repeats a name or has an empty one, and empty lines come "
                "before it; remove them or rename the columns in the file"
            )
        if renamed and any("\n" in n or "\r" in n for n in raw):
            # New names replace the header by skipping its line, which a quoted newline breaks.
            raise UnsupportedFileError(
                f"{url}: the header repeats a name or has an empty one, and a name holds a "
                "line break; rename the columns in the file"
            )
        if given is not None:
            missing = [n for n in given.names if n not in names]
            if missing:
                raise SchemaMismatchError(
                    f"{url}: the schema's column(s) {missing} are not in the header {list(names)}"
                )
            return TextParsing(names, given, inferred=False, file_names=renamed)
        # A column whose sampled values are all nulls infers as null: it is read as string
        # (which holds anything a later row may hold), its null values as nulls, as pyarrow
        # reads a column it types null.
        fields = [f.with_name(n) for f, n in zip(schema, names, strict=True)]
        empty = tuple(f.name for f in fields if pa.types.is_null(f.type))
        fields = [f.with_type(pa.string()) if f.name in empty else f for f in fields]
        return TextParsing(
            names,
            pa.schema(fields),
            inferred=True,
            empty_is_null=empty,
            null_values=tuple(self.null_values) if self.null_values is not None else _NULL_VALUES,
            file_names=renamed,
        )

    def _read_options(
        self, block: int, *, whole: bool, names: Sequence[str] | None, renamed: bool = False
    ) -> pacsv.ReadOptions:
        """``whole``: the bytes start at the file's start, where pyarrow reads the header;
        ``renamed``: ``names`` replace the header's (its line is skipped)."""
        common: dict[str, Any] = {
            "use_threads": False,
            "block_size": block,
            "encoding": self.encoding,
        }
        if self.header and whole and renamed:
            return pacsv.ReadOptions(
                **common, column_names=list(names or ()), skip_rows_after_names=1
            )
        if self.header and whole:
            return pacsv.ReadOptions(**common)
        if names is None:
            return pacsv.ReadOptions(**common, autogenerate_column_names=True)
        return pacsv.ReadOptions(**common, column_names=list(names))

    def _reader(
        self,
        source: pa.NativeFile,
        spec: TextParsing,
        columns: list[str],
        whole: bool,
        block: int | None = None,
    ) -> Iterator[pa.RecordBatch]:
        types = {f.name: f.type for f in spec.schema}
        reader = pacsv.open_csv(
            source,
            read_options=self._read_options(
                block or _CSV_BLOCK,
                whole=whole,
                names=spec.names,
                renamed=bool(spec.file_names),
            ),
            parse_options=self._parse_options(self.newlines_in_values is not False),
            convert_options=self._convert(types, columns),
        )
        yield from reader

    def _bad_value(
        self, exc: pa.ArrowInvalid, chunk: Chunk, fs: FileSystemSpec, spec: TextParsing, where: str
    ) -> CorruptFileError:
        not_utf8 = _NOT_UTF8.search(str(exc))
        if not_utf8 is not None:
            return self._not_utf8(int(not_utf8[1]), chunk, fs, spec, where)
        found = _CONVERSION.search(str(exc))
        if found is None:
            return super()._bad_value(exc, chunk, fs, spec, where)
        index, type_name, value = int(found[1]), found[2], found[3]
        column = spec.names[index] if index < len(spec.names) else f"#{index}"
        try:
            at = self._locate(chunk, fs, spec, column, lambda v: v == value)
        except (CorruptFileError, StorageError, pa.ArrowException):
            at = ""  # the error at hand says enough; locating it is a courtesy
        advice = (
            f"; {column!r} was inferred as {type_name} from the first {self.infer_bytes} bytes "
            "of the first file with rows: pass format_options={'schema': pyarrow.schema([...])} "
            "with a type that holds this value (pyarrow.string() holds any)"
            if spec.inferred
            else ""
        )
        return CorruptFileError(
            f"{where}: column {column!r}: value {value!r}{at} is not a valid {type_name}{advice}"
        )

    def _not_utf8(
        self, index: int, chunk: Chunk, fs: FileSystemSpec, spec: TextParsing, where: str
    ) -> CorruptFileError:
        """The error of a text value that is not UTF-8: where it is, and how to read it."""
        column = spec.names[index] if index < len(spec.names) else f"#{index}"
        try:
            at = self._locate(chunk, fs, spec, column, _not_utf8, kind=pa.binary())
        except (CorruptFileError, StorageError, pa.ArrowException):
            at = ""  # the error at hand says enough; locating it is a courtesy
        return CorruptFileError(
            f"{where}: column {column!r}: a value{at} is not {_named(self.encoding)} text. "
            "If the file is in another encoding, pass format_options={'encoding': ...} with it "
            "(e.g. 'latin-1', 'cp1252', 'shift_jis'; pyarrow transcodes it to UTF-8); to read "
            "the column's bytes as they are, pass format_options={'schema': "
            f"pyarrow.schema([...])}} with pyarrow.binary() for {column!r}"
        )

    def null_origin(
        self, chunk: Chunk, column: str, fs: FileSystemSpec, options: ReadOptions
    ) -> str:
        """Where the first null of ``column`` in ``chunk`` comes from: ``"value 'n/a' at line
        12 (byte 230, row 10 of the chunk)"``, or ``""`` when not found; for an error that
        refuses nulls to name the text that made one (pyarrow reads its ``null_values``, such
        as ``n/a`` or ``NULL``, as nulls in a column it types as non-string).
        """
        spec = self._spec(chunk.path, fs, options)
        nulls = set(self.null_values if self.null_values is not None else _NULL_VALUES)
        hit: list[str] = []

        def is_null(v: str | None) -> bool:
            if v is None or v in nulls:
                hit.append("" if v is None else v)
                return True
            return False

        try:
            at = self._locate(chunk, fs, spec, column, is_null)
        except (CorruptFileError, StorageError, pa.ArrowException):
            return ""
        return f"value {hit[0]!r}{at}" if hit else ""

    def _locate(
        self,
        chunk: Chunk,
        fs: FileSystemSpec,
        spec: TextParsing,
        column: str,
        match: Callable[[Any], bool],
        *,
        kind: pa.DataType | None = None,
    ) -> str:
        """Where the first value of ``column`` (read as ``kind``, default string) in ``chunk``
        that ``match``es is: its line in the file and byte offset when the chunk's bytes can be
        scanned for record boundaries, else its row."""
        strings = dataclasses.replace(
            spec,
            schema=pa.schema([(column, kind or pa.string())]),
            inferred=False,
            empty_is_null=(),
        )
        row = 0
        for batch in self._batches(chunk, fs, strings, [column]):
            hits = [i for i, v in enumerate(batch.column(0).to_pylist()) if match(v)]
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
        for offset in range(chunk.start, chunk.stop, SCAN_BYTES):
            size = min(SCAN_BYTES, chunk.stop - offset)
            ends.extend(scan.feed(read_range(chunk.path, offset, size, fs)).tolist())
            if len(ends) >= wanted:
                break
        if len(ends) < wanted:  # (the scan and pyarrow disagree on records: a lone "\r")
            return f" (row {row} of the chunk)"
        byte = ends[wanted - 1] if wanted else chunk.start
        line = self._line(chunk.path, byte, fs)
        return f" at {line}byte {byte} (row {row} of the chunk)"

    def _line(self, path: str, byte: int, fs: FileSystemSpec) -> str:
        """``"line N, "`` of the record starting at ``byte`` (1-based, counting every line
        feed before it), or ``""`` past `_LINES_UP_TO` bytes."""
        if byte > _LINES_UP_TO:
            return ""
        lines = 1
        for offset in range(0, byte, SCAN_BYTES):
            lines += read_range(path, offset, min(SCAN_BYTES, byte - offset), fs).count(b"\n")
        return f"line {lines}, "

    def __repr__(self) -> str:
        return f"CsvFormat(delimiter={self.delimiter!r}, header={self.header})"


def _named(encoding: str) -> str:
    """``encoding`` as messages name it (``"utf8"``: ``"UTF-8"``)."""
    return "UTF-8" if codecs.lookup(encoding).name == "utf-8" else encoding


def _not_utf8(value: bytes | None) -> bool:
    if value is None:
        return False
    try:
        value.decode("utf-8")
    except UnicodeDecodeError:
        return True
    return False


def _ascii_compatible(encoding: str) -> str:
    """``encoding``, checked: record boundaries are found in the raw bytes, so newlines,
    quotes and delimiters must be their ASCII bytes (UTF-8, Latin-1, cp1252, Shift-JIS, EUC:
    yes; UTF-16: no)."""
    probe = '\n\r",;\t|abc019'
    try:
        same = probe.encode(encoding) == probe.encode("ascii")
    except LookupError:
        raise InvalidArgumentError(f"unknown encoding {encoding!r}") from None
    if not same:
        raise InvalidArgumentError(
            f"encoding {encoding!r} does not keep ASCII bytes (newlines, quotes, delimiters) "
            "as they are, which finding records in byte ranges needs; re-encode the file as "
            "UTF-8"
        )
    return encoding
