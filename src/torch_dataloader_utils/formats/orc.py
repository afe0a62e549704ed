"""ORC: chunks are stripe ranges, planned from file tails (postscript and footer) we parse.

pyarrow's ``ORCFile`` tells the number of stripes but not their row counts or sizes, which
chunks need. The footer holds them (``StripeInformation``), so planning reads the tail
once, in one request, and parses the few protobuf fields it needs here. Footers compressed with
a codec we cannot decode ourselves (LZO; a zstd frame without its size) fall back to counting
each stripe's rows by reading its narrowest column, which is slower but exact.
"""

from __future__ import annotations

import zlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
from pyarrow import orc

from ..errors import CorruptFileError
from ..fs import FileSystemSpec, ListedFile
from ..fs.ranges import RangeFile
from ..planning import Chunk
from .base import Format, FormatPlan, Listing, ReadOptions
from .chunking import file_chunks
from .handles import HandleCache
from .magic import refuse_other_format
from .names import unique_names, unique_schema, warn_renamed
from .opening import each_file, open_input, parsing, read_range
from .schemas import FileSchema, check_schemas

__all__ = ["OrcFormat"]

_KIND = "a readable ORC file"
# Bytes read from the end of a file at plan time: postscript, footer and usually the stripe
# statistics fit (liborc guesses 16 KiB); a longer footer costs one more request.
_TAIL_BYTES = 64 << 10
_LIBORC_TAIL = 16 << 10
# Rows per yielded batch: a stripe is decoded whole (pyarrow has no finer read), then handed
# out in zero-copy slices so downstream blocks fill evenly.
_READ_BATCH_ROWS = 16_384
# Open files kept per worker (see ParquetFormat: shuffled streams rarely revisit a file).
_OPEN_FILES = 1
# Postscript compression kinds (orc_proto.proto CompressionKind).
_NONE, _ZLIB, _SNAPPY, _LZO, _LZ4, _ZSTD = range(6)


class _UnsupportedCodecError(Exception):
    """The footer's codec is one we cannot decode: count rows by reading instead."""


# --- the tail: a minimal protobuf reader and ORC's compression blocks --------------------------


def _varint(data: bytes, pos: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        if pos >= len(data) or shift > 63:
            raise ValueError(f"truncated varint at byte {pos}")
        byte = data[pos]
        value |= (byte & 0x7F) << shift
        pos += 1
        if byte < 0x80:
            return value, pos
        shift += 7


def _fields(data: bytes) -> Iterator[tuple[int, int | bytes]]:
    """``(field number, value)`` of a protobuf message: varints as ints, length-delimited
    fields as bytes; fixed-width fields are skipped (the ORC fields read here have none)."""
    pos = 0
    while pos < len(data):
        key, pos = _varint(data, pos)
        number, wire = key >> 3, key & 7
        if wire == 0:
            value, pos = _varint(data, pos)
            yield number, value
        elif wire == 2:
            size, pos = _varint(data, pos)
            if pos + size > len(data):
                raise ValueError(f"field {number} runs past the end ({size} bytes at {pos})")
            yield number, data[pos : pos + size]
            pos += size
        elif wire in (1, 5):
            pos += 8 if wire == 1 else 4
        else:
            raise ValueError(f"wire type {wire} of field {number} at byte {pos}")
    if pos != len(data):
        raise ValueError("the last field runs past the end")


def _ints(data: bytes) -> dict[int, int]:
    return {n: v for n, v in _fields(data) if isinstance(v, int)}


def _exact_lz4(block: bytes, limit: int) -> bytes:
    """A raw LZ4 block holds no decompressed size and pyarrow's codec returns the whole output
    buffer it is given: the smallest buffer that decodes is the exact size (LZ4 refuses to
    write past a too-small one)."""
    codec = pa.Codec("lz4_raw")
    lo, hi = 0, limit  # decoding into hi bytes must work
    codec.decompress(block, decompressed_size=hi)
    while lo + 1 < hi:
        mid = (lo + hi) // 2
        try:
            codec.decompress(block, decompressed_size=mid)
            hi = mid
        except (OSError, pa.ArrowException):
            lo = mid
    return bytes(codec.decompress(block, decompressed_size=hi, asbytes=True))


def _zstd_size(block: bytes) -> int:
    """The content size in a zstd frame header (RFC 8878 3.1.1.1)."""
    if block[:4] != b"\x28\xb5\x2f\xfd":
        raise ValueError("not a zstd frame")
    descriptor = block[4]
    size_flag, single = descriptor >> 6, (descriptor >> 5) & 1
    pos = 5 + (0 if single else 1) + (0, 1, 2, 4)[descriptor & 3]
    width = (1 if single else 0, 2, 4, 8)[size_flag]
    if width == 0:
        raise _UnsupportedCodecError("a zstd frame without its content size")
    size = int.from_bytes(block[pos : pos + width], "little")
    return size + 256 if width == 2 else size


def _decompress(data: bytes, kind: int, block_size: int) -> bytes:
    """Undo ORC's compression: blocks with a 3-byte header ``length << 1 | original``."""
    if kind == _NONE:
        return data
    if kind not in (_ZLIB, _SNAPPY, _LZ4, _ZSTD):
        raise _UnsupportedCodecError(f"compression kind {kind}")
    out = bytearray()
    pos = 0
    while pos < len(data):
        if pos + 3 > len(data):
            raise ValueError(f"truncated compression block header at byte {pos}")
        header = int.from_bytes(data[pos : pos + 3], "little")
        pos += 3
        size, original = header >> 1, header & 1
        block = data[pos : pos + size]
        if len(block) != size:
            raise ValueError(f"compression block of {size} bytes at byte {pos} is truncated")
        pos += size
        if original:
            out += block
        elif kind == _ZLIB:
            out += zlib.decompress(block, -15)  # raw deflate, no zlib header
        elif kind == _SNAPPY:
            n, _ = _varint(block, 0)  # a snappy block starts with its decompressed size
            out += pa.Codec("snappy").decompress(block, decompressed_size=n, asbytes=True)
        elif kind == _LZ4:
            out += _exact_lz4(block, max(block_size, 1))
        else:
            out += pa.Codec("zstd").decompress(
                block, decompressed_size=_zstd_size(block), asbytes=True
            )
    return bytes(out)


def parse_stripes(tail: bytes, file_size: int) -> list[tuple[int, int]]:
    """``(rows, bytes)`` of each stripe, from the last ``len(tail)`` bytes of an ORC file.

    Raises:
        ValueError: the tail does not parse (or is too short to hold the footer).
        _UnsupportedCodecError: the footer's codec is not one we decode.
    """
    if not tail:
        raise ValueError("no bytes")
    ps_size = tail[-1]
    if ps_size + 1 > len(tail):
        raise ValueError(f"postscript of {ps_size} bytes does not fit the file")
    postscript = dict(_fields(tail[-1 - ps_size : -1]))
    # Hive 0.11 wrote no magic in the postscript, only at the file's start (which liborc
    # checks when it opens such a file, before this parse runs).
    if postscript.get(8000, b"ORC") != b"ORC":
        raise ValueError("no 'ORC' magic in the postscript")
    footer_size = int(postscript.get(1, 0))
    start = len(tail) - 1 - ps_size - footer_size
    if start < 0:
        raise ValueError(f"footer of {footer_size} bytes is outside the bytes read")
    kind, block_size = int(postscript.get(2, _NONE)), int(postscript.get(3, 256 << 10))
    footer = _decompress(tail[start : start + footer_size], kind, block_size)
    stripes = []
    for number, value in _fields(footer):
        if number == 3 and isinstance(value, bytes):  # StripeInformation
            info = _ints(value)
            offset, rows = info.get(1, 0), info.get(5, 0)
            size = info.get(2, 0) + info.get(3, 0) + info.get(4, 0)
            if offset + size > file_size:
                raise ValueError(f"stripe at byte {offset} of {size} bytes runs past the end")
            stripes.append((rows, size))
    return stripes


def _tail_need(tail: bytes) -> int:
    """Bytes from the end that hold the postscript and footer (0 when unreadable)."""
    try:
        ps_size = tail[-1]
        postscript = dict(_fields(tail[-1 - ps_size : -1]))
        return 1 + ps_size + int(postscript.get(1, 0))
    except (ValueError, IndexError):
        return 0


# --- planning ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class _FileFacts:
    schema: pa.Schema
    stripes: list[tuple[int, int]]  # (rows, bytes)


def _narrowest(schema: pa.Schema) -> str:
    """The column cheapest to decode (fixed width first): rows are counted by reading it."""
    widths = [(f.type.bit_width if pa.types.is_primitive(f.type) else 1 << 20) for f in schema]
    return str(schema.names[widths.index(min(widths))])


def _count_by_reading(reader: orc.ORCFile, schema: pa.Schema) -> list[int]:
    """Rows of each stripe, read from its narrowest column."""
    column = _narrowest(schema)
    return [reader.read_stripe(i, columns=[column]).num_rows for i in range(reader.nstripes)]


def _read_facts(f: ListedFile, fs: FileSystemSpec) -> _FileFacts:
    try:
        return _parse_facts(f, fs)
    except CorruptFileError as exc:  # say so when it is another format
        refuse_other_format(f, fs, "ORC", exc)
        raise


def _parse_facts(f: ListedFile, fs: FileSystemSpec) -> _FileFacts:
    url = fs.url(f.path)
    if f.size == 0:
        raise CorruptFileError(f"{url}: the file is empty (0 bytes), not an ORC file")

    def fetch(offset: int, size: int) -> bytes:
        return read_range(f.path, offset, size, fs)  # storage errors typed, not parsed

    lo = max(0, f.size - _TAIL_BYTES)
    tail = fetch(lo, f.size - lo)
    # A long footer: read the rest of it, and at least what liborc reads on open.
    need = min(f.size, max(_tail_need(tail), _LIBORC_TAIL))
    if need > len(tail):
        lo = f.size - need
        tail = fetch(lo, f.size - lo - len(tail)) + tail
    # pyarrow reads the schema from the bytes in memory; any other read is fetched on demand.
    source = RangeFile(f.size, {lo: tail}, fetch)
    with parsing(url, _KIND):
        reader = orc.ORCFile(source.arrow())
        schema = reader.schema.remove_metadata()
        nstripes, nrows = reader.nstripes, reader.nrows
    try:
        stripes = parse_stripes(tail, f.size)
    except _UnsupportedCodecError:
        with parsing(url, _KIND):
            counts = _count_by_reading(reader, schema)
        # Sizes unknown: the stripes share the file's bytes in proportion to their rows.
        total = max(sum(counts), 1)
        stripes = [(n, f.size * n // total) for n in counts]
    except (ValueError, IndexError) as exc:
        raise CorruptFileError(f"{url}: the ORC footer does not parse ({exc})") from exc
    if len(stripes) != nstripes or sum(r for r, _ in stripes) != nrows:
        raise CorruptFileError(
            f"{url}: the ORC footer lists {len(stripes)} stripes of "
            f"{sum(r for r, _ in stripes)} rows, the reader {nstripes} of {nrows}"
        )
    return _FileFacts(schema, stripes)


def _row_bytes(schema: pa.Schema, facts: Sequence[_FileFacts]) -> float:
    """Decoded bytes per row, estimated: fixed-width columns exactly, and at least the
    compressed bytes per row of the whole stripes (the footer has no decoded sizes)."""
    fixed = sum(f.type.bit_width // 8 for f in schema if pa.types.is_primitive(f.type))
    rows = sum(r for fact in facts for r, _ in fact.stripes)
    size = sum(s for fact in facts for _, s in fact.stripes)
    return float(max(fixed, size / rows if rows else 0.0, 1.0))


class OrcFormat(Format):
    """Apache ORC.

    Planning reads each file's tail (one request) in parallel threads and makes a chunk of
    each stripe, or of consecutive stripes grouped to ``split_bytes``/``split_rows``; one big
    file is thus several chunks that several workers read. A read decodes whole stripes
    (``ORCFile.read_stripe``: pyarrow has no finer ORC read), so a piece that starts inside a
    stripe decodes the stripe's earlier rows too, and memory per worker is one decoded
    stripe. Chunk byte sizes are whole stripes (all columns): the footer has no per-column
    sizes. No row-group pruning by the filter (pyarrow exposes no stripe statistics); the
    dataset applies it to rows.
    """

    name = "orc"

    def __init__(self) -> None:
        # (reader, source) per file; a forked child opens its own (see `HandleCache`).
        self._open: HandleCache[str, tuple[orc.ORCFile, pa.NativeFile]] = HandleCache(
            _OPEN_FILES, lambda pair: pair[1].close()
        )

    def __reduce__(self) -> tuple[type[OrcFormat], tuple[()]]:
        return (type(self), ())  # open files stay behind: each process opens its own

    def schema(self, file: ListedFile, fs: FileSystemSpec) -> pa.Schema:
        url = fs.url(file.path)
        if file.size == 0:
            raise CorruptFileError(f"{url}: the file is empty (0 bytes), not an ORC file")

        def read() -> pa.Schema:
            with open_input(file.path, fs) as source, parsing(url, _KIND):
                schema: pa.Schema = orc.ORCFile(source).schema
                return unique_schema(schema.remove_metadata())

        try:
            return fs.request(read, what=url)
        except CorruptFileError as exc:  # say so when it is another format
            refuse_other_format(file, fs, "ORC", exc)
            raise

    per_file = True  # (`Format.plan`: each file's facts, assembled)

    def facts(self, listing: Listing, fs: FileSystemSpec, options: ReadOptions) -> list[Any]:
        return each_file(lambda f: _read_facts(f, fs), listing.files)

    def assemble(
        self, listing: Listing, facts: Sequence[Any], fs: FileSystemSpec, options: ReadOptions
    ) -> FormatPlan:
        files = listing.files
        for f, fact in zip(files, facts, strict=True):
            warn_renamed(fs.url(f.path), fact.schema.names, stacklevel=4)
        schema = check_schemas(
            files,
            [FileSchema(unique_schema(f.schema), bool(f.stripes)) for f in facts],
            fs,
            options,
        )
        units = [[(i, rows, size) for i, (rows, size) in enumerate(x.stripes)] for x in facts]
        chunks = file_chunks(listing, units, options)
        return FormatPlan(chunks=chunks, schema=schema, row_bytes=_row_bytes(schema, facts))

    def _file(self, path: str, fs: FileSystemSpec) -> orc.ORCFile:
        def open_file() -> tuple[orc.ORCFile, pa.NativeFile]:
            source = open_input(path, fs)
            try:
                with parsing(fs.url(path), _KIND):
                    return orc.ORCFile(source), source
            except BaseException:  # corrupt, or the storage failed mid-parse
                source.close()
                raise

        return self._open.get(path, open_file)[0]

    def read(
        self,
        chunk: Chunk,
        row_start: int,
        row_stop: int,
        fs: FileSystemSpec,
        options: ReadOptions,
    ) -> Iterator[pa.RecordBatch]:
        url = fs.url(chunk.path)
        columns = list(options.columns) if options.columns is not None else None
        first = 0  # row of the chunk where the current stripe starts
        for stripe, rows in zip(range(chunk.start, chunk.stop), chunk.unit_rows, strict=True):
            lo, hi = max(row_start, first) - first, min(row_stop, first + rows) - first
            first += rows
            if lo >= hi:
                if first >= row_stop:
                    return
                continue
            where = f"{url} stripe {stripe} (rows {lo}:{hi})"

            def decode(stripe: int = stripe, where: str = where) -> pa.RecordBatch:
                handle = self._file(chunk.path, fs)
                names = unique_names(handle.schema.names)
                with parsing(where, _KIND):
                    decoded = columns
                    if names != tuple(handle.schema.names):
                        # liborc selects by name, and a repeated one picks any of its columns:
                        # decode them all, then name them uniquely (such files are rare).
                        whole: pa.RecordBatch = handle.read_stripe(stripe)
                        return whole.rename_columns(list(names))
                    if columns == [] and handle.schema.names:
                        # No columns (a count, or hive partition keys only): liborc decodes no
                        # rows from an empty column list, so the narrowest column is read,
                        # then dropped below.
                        decoded = [_narrowest(handle.schema)]
                    batch: pa.RecordBatch = handle.read_stripe(stripe, columns=decoded)
                return batch

            batch = decode() if fs.is_local else fs.request(decode, what=where)
            if batch.num_rows != rows:
                raise CorruptFileError(
                    f"{where}: decoded {batch.num_rows} rows, the footer says {rows}"
                )
            if columns is not None:
                batch = batch.select(columns)  # read_stripe keeps the file's column order
            for at in range(lo, hi, _READ_BATCH_ROWS):
                yield batch.slice(at, min(_READ_BATCH_ROWS, hi - at))

    def close(self) -> None:
        self._open.clear()
