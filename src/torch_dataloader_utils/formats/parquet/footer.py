"""The facts planning needs from a Parquet footer, read and checked without pyarrow's metadata
accessors.

Why a parser of our own (a measured gap): pyarrow's ``RowGroupMetaData.column(j)`` lets a C++
exception escape when a column's metadata is encrypted (a plaintext-footer encrypted file, or a
fuzzed footer that claims so), which aborts the interpreter (SIGABRT) instead of raising; and
pyarrow accepts footers whose row groups carry negative row counts or unknown codecs, which then
read as empty. So the footer's Thrift (compact protocol, `thrift`) is walked here, only the
fields planning uses are kept, and every count, size, offset and codec is checked against the file
before pyarrow is asked anything per column. Its cost: docs/adr/0019-format-measurements.md.

Thrift structures (parquet.thrift): FileMetaData {3: num_rows, 4: row_groups}; RowGroup
{1: columns, 3: num_rows}; ColumnChunk {3: meta_data, 8: crypto_metadata}; ColumnMetaData
{4: codec, 5: num_values, 6: total_uncompressed_size, 7: total_compressed_size,
9: data_page_offset, 11: dictionary_page_offset, 12: statistics {3: null_count},
16: size_statistics {3: definition_level_histogram}}.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from ...errors import CorruptFileError, UnsupportedFileError
from ...fs import FileSystemSpec
from ...fs.ranges import RangeFile
from ..opening import LocalFile, open_input, parsing
from . import shapes
from .thrift import (
    BINARY,
    FALSE,
    I16,
    I32,
    I64,
    LIST,
    STOP,
    STRUCT,
    ThriftError,
    integer,
    skip,
    structs,
    varint,
    zigzag,
)

if TYPE_CHECKING:
    import pyarrow.compute as pc
    import pyarrow.dataset as ds

__all__ = [
    "ColumnFacts",
    "Footer",
    "file_metadata",
    "footer_file",
    "native_fragment",
    "parse_footer",
    "read_footer",
]

MAGIC = b"PAR1"
ENCRYPTED_MAGIC = b"PARE"
# Bytes read from the end of a file at once: pyarrow's own first footer read.
TAIL_BYTES = 64 << 10
# Codecs of parquet.thrift's CompressionCodec (UNCOMPRESSED .. LZ4_RAW).
_CODECS = range(8)


@dataclass(frozen=True, slots=True)
class ColumnFacts:
    """One column chunk: its bytes in the file and its sizes; and, as the footer gives them
    (unchecked, ``None`` where absent), what tells a list column's values (`tokens`):
    ``values``, one per level (a leaf value, a null, a null or empty list), and where its
    statistics and size statistics start in the footer's bytes (`Footer.thrift`), decoded only
    for the column that needs them."""

    start: int  # first byte (the dictionary page's, when it comes first)
    compressed: int
    uncompressed: int
    values: int | None = None
    statistics: int | None = None
    sizes: int | None = None


@dataclass(frozen=True, slots=True)
class Footer:
    """A checked footer: rows per row group and each row group's column chunks, in leaf order.

    ``rest`` is every byte of the footer but the values of its row count and row groups (the
    schema, key-value metadata, writer, column orders): files whose ``rest`` is equal have the
    same Arrow schema, which is worked out once for them (`facts`). ``thrift``: all its bytes.
    """

    num_rows: int
    row_groups: tuple[tuple[int, tuple[ColumnFacts, ...]], ...]  # (rows, columns)
    rest: tuple[bytes, ...] = ()
    thrift: bytes = b""


# The structures planning reads are walked by one function each (below), with the field
# headers decoded inline: a STOP type ends a struct, a kept integer field must have an integer
# type, a repeated field's last value wins, a kept list must be a list of structs (an empty
# one may name any element type, as Thrift's reader allows: docs/adr/0017), and every other
# field is skipped (integers and strings inline).


# ColumnMetaData's integer fields planning keeps (`_Meta`'s order, then where the statistics
# and the size statistics start).
_META_FIELDS = shapes.META_SLOTS
_Meta = list[Any]
# The element types of the lists `_column_meta` skips inline when they hold under 15 (their
# size in the list's header byte).
_SHORT_LISTS = frozenset((I16, I32, I64, BINARY))


def _column_meta(data: bytes, pos: int, kind: int) -> tuple[_Meta, int]:
    """ColumnMetaData (3 structs deep): codec (4), values (5), sizes (6, 7), page offsets (9,
    11), where the statistics (12) and size statistics (16) start."""
    if kind != STRUCT:
        raise ThriftError("a struct field is not a struct")
    found: _Meta = [None, None, None, None, None, None, None, None]
    field = 0
    while True:
        head = data[pos]
        pos += 1
        kind = head & 0x0F
        if kind == STOP:
            return found, pos
        if head >> 4:
            field += head >> 4
        else:
            field, pos = zigzag(data, pos)
        slot = _META_FIELDS.get(field)
        if I16 <= kind <= I64:
            if slot is None:
                while data[pos] & 0x80:
                    pos += 1
                pos += 1
            else:  # (a zigzag varint, inline: six a column chunk)
                value = shift = 0
                while True:
                    byte = data[pos]
                    pos += 1
                    value |= (byte & 0x7F) << shift
                    if byte < 0x80:
                        break
                    shift += 7
                    if shift > 70:
                        raise ThriftError("a varint runs past 10 bytes")
                found[slot] = (value >> 1) ^ -(value & 1)
        elif slot is not None:
            raise ThriftError(f"field {field} is not an integer")
        elif kind == BINARY:
            n, pos = varint(data, pos)
            pos += n
        elif kind == LIST and data[pos] < 0xF0 and data[pos] & 0x0F in _SHORT_LISTS:
            # a short list of integers (encodings) or strings (path_in_schema), inline
            size, element = data[pos] >> 4, data[pos] & 0x0F
            pos += 1
            for _ in range(size):
                if element == BINARY:
                    n, pos = varint(data, pos)
                    pos += n
                else:
                    while data[pos] & 0x80:
                        pos += 1
                    pos += 1
        elif kind > FALSE:
            if kind == STRUCT and field in (12, 16):
                found[6 if field == 12 else 7] = pos
            pos = skip(data, pos, kind, 4)


def _column_chunk(data: bytes, pos: int) -> tuple[_Meta | None, bool, int]:
    """ColumnChunk (2 structs deep): its metadata (3), whether it is encrypted (8, 9)."""
    meta = None
    encrypted = False
    field = 0
    while True:
        head = data[pos]
        pos += 1
        kind = head & 0x0F
        if kind == STOP:
            return meta, encrypted, pos
        if head >> 4:
            field += head >> 4
        else:
            field, pos = zigzag(data, pos)
        if field == 3:
            meta, pos = _column_meta(data, pos, kind)
        elif field in {8, 9}:
            pos = skip(data, pos, kind, 3)
            encrypted = True
        elif I16 <= kind <= I64:
            while data[pos] & 0x80:
                pos += 1
            pos += 1
        elif kind > FALSE:
            pos = skip(data, pos, kind, 3)


def _row_group(data: bytes, pos: int) -> tuple[dict[int, Any], int]:
    """RowGroup (1 struct deep): its column chunks (1) and rows (3)."""
    found: dict[int, Any] = {}
    field = 0
    while True:
        head = data[pos]
        pos += 1
        kind = head & 0x0F
        if kind == STOP:
            return found, pos
        if head >> 4:
            field += head >> 4
        else:
            field, pos = zigzag(data, pos)
        if field == 1:
            size, pos = structs(data, pos, kind)
            chunks = []
            for _ in range(size):
                meta, encrypted, pos = _column_chunk(data, pos)
                chunks.append((meta, encrypted))
            found[1] = chunks
        elif field == 3:
            found[3], pos = integer(data, pos, kind, field)
        elif I16 <= kind <= I64:
            while data[pos] & 0x80:
                pos += 1
            pos += 1
        elif kind > FALSE:
            pos = skip(data, pos, kind, 2)


def _file_meta(data: bytes) -> tuple[dict[int, Any], list[tuple[int, int]], int]:
    """FileMetaData: rows (3) and row groups (4); the byte spans of those fields' values; and
    the position after the struct."""
    found: dict[int, Any] = {}
    spans: list[tuple[int, int]] = []
    field = 0
    pos = 0
    while True:
        head = data[pos]
        pos += 1
        kind = head & 0x0F
        if kind == STOP:
            return found, spans, pos
        if head >> 4:
            field += head >> 4
        else:
            field, pos = zigzag(data, pos)
        start = pos
        if field == 3:
            found[3], pos = integer(data, pos, kind, field)
            spans.append((start, pos))
        elif field == 4:
            size, pos = structs(data, pos, kind)
            groups = []
            for _ in range(size):
                group, pos = _row_group(data, pos)
                groups.append(group)
            found[4] = groups
            spans.append((start, pos))
        elif I16 <= kind <= I64:
            while data[pos] & 0x80:
                pos += 1
            pos += 1
        elif kind > FALSE:
            pos = skip(data, pos, kind, 1)


def parse_footer(thrift: bytes, url: str, size: int) -> Footer:
    """Parse and check FileMetaData ``thrift`` of a file of ``size`` bytes.

    Raises:
        CorruptFileError: the footer does not parse, or a count, size, offset or codec in it
            is impossible.
        UnsupportedFileError: a column's metadata is encrypted.
    """
    walk = known = shapes.walked(thrift)  # (a footer of a shape read before is not walked)
    if walk is None:
        try:
            walk = _file_meta(thrift)
            if walk[2] > len(thrift):
                raise ThriftError("a field runs past the footer")
        except IndexError:
            raise CorruptFileError(
                f"{url}: the Parquet footer does not parse (it ends early)"
            ) from None
        except ThriftError as exc:
            raise CorruptFileError(f"{url}: the Parquet footer does not parse ({exc})") from None
    found, spans, end = walk
    num_rows = found.get(3)
    if num_rows is None or 4 not in found:
        raise CorruptFileError(f"{url}: the Parquet footer lacks num_rows or row_groups")
    if num_rows < 0:
        raise CorruptFileError(f"{url}: the Parquet footer gives {num_rows} rows")
    groups = []
    for i, group in enumerate(found[4]):
        rows = group.get(3)
        if rows is None or rows < 0:
            raise CorruptFileError(f"{url}: row group {i} gives {rows} rows")
        columns = []
        for j, (meta, encrypted) in enumerate(group.get(1, ())):
            if encrypted:
                raise UnsupportedFileError(
                    f"{url}: row group {i} column chunk {j}: the column's metadata is "
                    "encrypted; encrypted Parquet is not supported (decrypt the file first, "
                    "e.g. with pyarrow's FileDecryptionProperties, and write it back)"
                )
            columns.append(_column(meta, url, i, j, size=size, rows=rows))
        groups.append((rows, tuple(columns)))
    if known is None:  # (every check passed: a shape worth reusing, `shapes`)
        shapes.learn(thrift, walk)
    # The file's num_rows is not checked against its row groups': real writers leave it 0
    # (parquet-testing's repeated_no_annotation.parquet); rows are the row groups'.
    rest = []
    cut = 0
    for start, stop in spans:
        rest.append(thrift[cut:start])
        cut = stop
    rest.append(thrift[cut:end])
    return Footer(num_rows, tuple(groups), tuple(rest), thrift)


def _column(meta: _Meta | None, url: str, i: int, j: int, *, size: int, rows: int) -> ColumnFacts:
    """Row group ``i``'s column chunk ``j``, checked against the file's ``size``."""
    codec, uncompressed, compressed, data, dictionary, values, statistics, sizes = (
        meta or [None] * 8
    )
    if codec is None or uncompressed is None or compressed is None or data is None:
        raise CorruptFileError(
            f"{url}: row group {i} column chunk {j}: the column chunk's metadata is missing"
        )
    if codec not in _CODECS:
        raise CorruptFileError(
            f"{url}: row group {i} column chunk {j}: unknown compression codec {codec}"
        )
    if compressed < 0 or uncompressed < 0:
        raise CorruptFileError(
            f"{url}: row group {i} column chunk {j}: negative size ({compressed} bytes "
            f"compressed, {uncompressed} uncompressed)"
        )
    start = data
    if dictionary is not None and 0 < dictionary < start:
        start = dictionary
    # A row group without rows is never read (pyarrow reads such files as empty too). A chunk
    # may overlap the footer: pyarrow reads such files (some writers padded chunks' sizes).
    if rows and (start < len(MAGIC) or start + compressed > size):
        raise CorruptFileError(
            f"{url}: row group {i} column chunk {j}: bytes [{start}:{start + compressed}) lie "
            f"outside the file's {size} bytes"
        )
    return ColumnFacts(start, compressed, uncompressed, values, statistics, sizes)


def read_tail(source: pa.NativeFile | LocalFile, size: int, url: str) -> tuple[bytes, int]:
    """The footer's bytes (Thrift, without length and magic) and the offset where they start;
    one read of `TAIL_BYTES` for most files, a second for a larger footer.

    Raises:
        CorruptFileError: no Parquet magic, or a footer length that does not fit the file.
        UnsupportedFileError: the footer is encrypted.
    """
    if size < 12:
        raise CorruptFileError(f"{url}: {size} bytes, too short for a Parquet file")
    first = min(size, TAIL_BYTES)
    tail = source.read_at(first, size - first)
    magic = tail[-4:]
    if magic == ENCRYPTED_MAGIC:
        raise UnsupportedFileError(
            f"{url}: the Parquet footer is encrypted; encrypted Parquet is not supported "
            "(decrypt the file first, e.g. with pyarrow's FileDecryptionProperties)"
        )
    if magic != MAGIC:
        raise CorruptFileError(f"{url}: not a Parquet file (no {MAGIC!r} at its end)")
    length = int.from_bytes(tail[-8:-4], "little")
    start = size - 8 - length
    if start < 0:
        raise CorruptFileError(f"{url}: the footer's length {length} exceeds the file's {size}")
    if length + 8 <= len(tail):
        return tail[len(tail) - 8 - length : -8], start
    return source.read_at(length, start), start


def read_footer(
    source: pa.NativeFile | LocalFile, size: int, url: str
) -> tuple[Footer, bytes, int]:
    """`read_tail` and `parse_footer`: the checked footer, its bytes and where they start."""
    thrift, start = read_tail(source, size, url)
    return parse_footer(thrift, url, size), thrift, start


def footer_file(source: pa.NativeFile, size: int, start: int, thrift: bytes) -> pa.PythonFile:
    """``source`` with its footer (``thrift`` at ``start``) already in memory: pyarrow parses
    the footer again from it without a second request; any other read goes to ``source``."""
    tail = thrift + len(thrift).to_bytes(4, "little") + MAGIC
    return RangeFile(size, {start: tail}, lambda offset, n: source.read_at(n, offset)).arrow()


def native_fragment(
    path: str, size: int, native: pafs.FileSystem, where: pc.Expression | None = None
) -> ds.ParquetFileFragment | None:
    """The Parquet file ``path`` of ``size`` bytes as a `pyarrow.dataset` fragment (in the
    partition ``where``), its footer read by pyarrow's C++ reader through ``native`` (a
    `FileSystemSpec.native_reads`); None where pyarrow fails.

    Made with the size a listing or a table's metadata told, the fragment opens with no
    metadata request and reads the footer in one ranged GET, at about a third of a request's
    CPU through botocore (docs/adr/0024-planning-at-scale.md#footers-read-natively). Where it
    fails (a file pyarrow cannot parse, a failed request, a size that is wrong), the caller
    reads the bytes as they are, which names what is wrong.
    """
    # (Imported here: pyarrow.dataset imports pandas, 0.5 s; the callers say when it is worth it.)
    import pyarrow.dataset as ds

    fragment = ds.ParquetFileFormat().make_fragment(
        path, native, partition_expression=where, file_size=size
    )
    try:
        fragment.ensure_complete_metadata()
    except (pa.ArrowException, OSError):
        return None
    return fragment


def file_metadata(path: str, fs: FileSystemSpec, size: int | None = None) -> pq.FileMetaData:
    """pyarrow's footer of the Parquet file ``path`` (a table kind's data file, whose row groups
    planning counts), read as one retried request. With its ``size`` (the table's metadata's)
    and once `pyarrow.dataset` is loaded (the table kinds load it), through pyarrow's own reader
    where reads go native (`native_fragment`).

    Raises:
        CorruptFileError: it is not a Parquet file.
        StorageError: the storage failed.
    """
    native = fs.native_reads() if size is not None and "pyarrow.dataset" in sys.modules else None
    if native is not None and size is not None:
        fragment = native_fragment(path, size, native)
        if fragment is not None:
            return fragment.metadata
    url = fs.url(path)

    def read() -> pq.FileMetaData:
        with open_input(path, fs) as source, parsing(url):
            return pq.read_metadata(source)

    return fs.request(read, what=url)
