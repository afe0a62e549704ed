"""Finding record boundaries in CSV and JSON Lines bytes, and cutting files into chunks there.

A record ends at a newline; in CSV only at a newline outside quotes: a newline is a record
boundary iff the number of quote characters before it in the file is even (a doubled quote
``""`` adds two, so it keeps the parity). Blank records (empty lines; whitespace-only lines in
JSON Lines) are not rows: pyarrow's readers skip them, and the counts here must agree with
what the readers yield. Bytes are scanned a range at a time with numpy, never per byte in Python.

Where the parity can disagree with pyarrow's CSV parser, the scan says so (`RecordScan.
unreliable`) rather than guess: a quote character that opens a quoted span anywhere but at the
start of a field (pyarrow takes it literally there), and a bare carriage return outside quotes
(pyarrow ends a record there, the scan would not). The caller then reads the file as one chunk
and counts its rows by parsing it.
"""

from __future__ import annotations

import lzma
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from ..fs import FileSystemSpec, translate_os_error
from .opening import parsing, read_range

__all__ = [
    "ChunkCutter",
    "RecordScan",
    "compression_of",
    "open_decompressed",
    "read_head",
    "read_ranges",
]

_LF, _CR = 10, 13
# Compressed files by extension (as fsspec infers them), and pyarrow's codec for each; xz has
# no pyarrow codec, so Python's lzma streams it.
_CODECS = {".gz": "gzip", ".bz2": "bz2", ".zst": "zstd", ".lz4": "lz4", ".xz": "xz"}


def compression_of(path: str) -> str | None:
    """The compression of ``path`` by its extension (``"gzip"``, ``"zstd"``, ...), or ``None``."""
    for ext, codec in _CODECS.items():
        if path.lower().endswith(ext):
            return codec
    return None


class RecordScan:
    """Finds the ends of the non-blank records of one file, fed range by range in order.

    Args:
        quote: the quote byte (CSV), or ``None`` (JSON Lines, or CSV without quoting).
        delimiter: the field delimiter byte (CSV), where a quoted field may start.
        blank: bytes that make a record blank when it holds nothing else (``\\r`` for CSV;
            also space and tab for JSON Lines).
        bare_cr_ends_records: whether a lone ``\\r`` ends a record for the parser (CSV): such
            a file is flagged unreliable.
    """

    def __init__(
        self,
        *,
        quote: int | None,
        delimiter: int | None,
        blank: bytes,
        bare_cr_ends_records: bool,
    ) -> None:
        self.quote = quote
        self.bare_cr = bare_cr_ends_records
        self.is_blank = np.zeros(256, dtype=bool)
        self.is_blank[list(blank)] = True
        self.field_start = np.zeros(256, dtype=bool)  # bytes after which a quote may open
        self.field_start[[_LF, _CR] + ([delimiter] if delimiter is not None else [])] = True
        if quote is not None:
            self.field_start[quote] = True  # a doubled quote: its first half closed a span
        self.unreliable: str | None = None  # why the parity may disagree with the parser
        self.offset = 0  # bytes fed so far
        self.quotes = 0  # quote bytes fed so far
        self.content = False  # whether the unfinished record holds a non-blank byte
        self.last_byte: int | None = None
        self.last_quote = -1  # file offset of the last quote byte fed
        # Where a quote opens that is never closed, when the parity says so reliably (every
        # quote opened or closed a field): the rest of the file would be one value.
        self.unclosed_at: int | None = None
        # A quote that closes a value (by the parity) followed by anything but a delimiter, a
        # line end or a second quote: ``(its offset, the opener's)``. A valid file has none;
        # one quote never closed makes every later quoted value look like this.
        self.stray_close: tuple[int, int] | None = None
        self.stray_open_at: int | None = None  # a quote opening inside an unquoted field
        self._closer_pending = -1  # offset of a closer that ended the last range fed
        self._pending_opener = -1  # the quote that opened it

    def _has_content(self, at: np.ndarray) -> bool:
        return bool(at.size) and not bool(self.is_blank[at].all())

    def feed(self, data: bytes | memoryview) -> np.ndarray:
        """Scan the next bytes; returns the file offsets one past each non-blank record
        finished in them (one past its ``\\n``), ascending."""
        a = np.frombuffer(data, dtype=np.uint8)
        off = self.offset
        newlines = np.flatnonzero(a == _LF)
        quotes = np.flatnonzero(a == self.quote) if self.quote is not None else None
        if quotes is not None:
            if self.unreliable is None and quotes.size:
                self._check_openers(a, quotes, off)
            if self.stray_close is None:
                self._check_closers(a, quotes, off)
            before = np.searchsorted(quotes, newlines) + self.quotes
            newlines = newlines[(before & 1) == 0]
        if self.bare_cr and self.unreliable is None:
            self._check_bare_cr(a, quotes, off)
        if quotes is not None:
            self.quotes += int(quotes.size)
            if quotes.size:
                self.last_quote = off + int(quotes[-1])
        if a.size:
            self.last_byte = int(a[-1])
        self.offset += int(a.size)
        if not newlines.size:
            self.content = self.content or self._has_content(a)
            return np.empty(0, dtype=np.int64)
        starts = np.empty(newlines.size, dtype=np.int64)
        starts[0] = 0
        starts[1:] = newlines[:-1] + 1
        lengths = newlines - starts
        nonblank = np.zeros(newlines.size, dtype=bool)
        some = lengths > 0
        nonblank[some] = ~self.is_blank[a[starts[some]]]
        # Records that start with a blank byte and are longer than one byte: look at them all.
        for i in np.flatnonzero(some & ~nonblank & (lengths > 1)):
            nonblank[i] = self._has_content(a[starts[i] : newlines[i]])
        # The first record may have begun in an earlier range.
        nonblank[0] = self.content or self._has_content(a[: newlines[0]])
        tail = int(newlines[-1]) + 1
        self.content = self._has_content(a[tail:])
        return off + newlines[nonblank].astype(np.int64) + 1

    @property
    def unclosed_before(self) -> tuple[int, int] | None:
        """``(closer, opener)`` offsets when a quote closes a value and is followed by neither
        a delimiter nor a line end before any quote opened inside an unquoted field (which
        would throw the parity off): a quote before it is then never closed."""
        stray = self.stray_close
        if stray is None or (self.stray_open_at is not None and self.stray_open_at < stray[0]):
            return None
        return stray

    def finish(self) -> np.ndarray:
        """After the last range: the end of an unterminated last record (the file size), if
        it is not blank; flags an unclosed quote as unreliable."""
        if self.quotes % 2 and self.unreliable is None:
            self.unclosed_at = self.last_quote
            self.unreliable = "a quoted value is not closed before the end of the file"
        if self.content:
            return np.array([self.offset], dtype=np.int64)
        return np.empty(0, dtype=np.int64)

    def _check_openers(self, a: np.ndarray, quotes: np.ndarray, off: int) -> None:
        # Quotes at an even position in the file's sequence of quotes open a quoted span.
        first_opener = self.quotes & 1  # index in `quotes` of this range's first opener
        openers = quotes[first_opener::2]
        if not openers.size:
            return
        prev = np.empty(openers.size, dtype=np.int64)
        inner = openers > 0
        prev[inner] = a[openers[inner] - 1]
        if not inner[0]:
            # At the range's start: the byte before is the last one fed (none at file start).
            prev[0] = _LF if self.last_byte is None else self.last_byte
        bad = np.flatnonzero(~self.field_start[prev])
        if bad.size:
            at = off + int(openers[bad[0]])
            self.stray_open_at = at
            self.unreliable = (
                f"a quote character inside an unquoted field at byte {at} (the parser takes "
                "it literally, so quote parity cannot find record boundaries)"
            )

    def _check_closers(self, a: np.ndarray, quotes: np.ndarray, off: int) -> None:
        # Quotes at an odd position in the file's sequence of quotes close a quoted span.
        if self._closer_pending >= 0 and a.size:
            if not self.field_start[a[0]]:
                self.stray_close = (self._closer_pending, self._pending_opener)
                return
            self._closer_pending = -1
        first = 1 - (self.quotes & 1)
        closers = np.arange(first, quotes.size, 2)
        if not closers.size:
            return
        at = quotes[closers]
        inner = at + 1 < a.size
        bad = np.flatnonzero(inner & ~self.field_start[a[np.minimum(at + 1, a.size - 1)]])
        if bad.size:
            i = int(closers[bad[0]])
            opener = off + int(quotes[i - 1]) if i else self.last_quote
            self.stray_close = (off + int(quotes[i]), opener)
        elif not inner[-1]:  # the last byte of the range: its successor comes next
            self._closer_pending = off + int(at[-1])
            i = int(closers[-1])
            self._pending_opener = off + int(quotes[i - 1]) if i else self.last_quote

    def _check_bare_cr(self, a: np.ndarray, quotes: np.ndarray | None, off: int) -> None:
        crs = np.flatnonzero(a == _CR)
        inner = crs[crs < a.size - 1]  # a last byte's successor is in the next range
        bare = inner[a[inner + 1] != _LF].astype(np.int64)
        if self.last_byte == _CR and a.size and a[0] != _LF:
            bare = np.concatenate([np.array([-1], dtype=np.int64), bare])
        if not bare.size:
            return
        before = self.quotes + (np.searchsorted(quotes, bare) if quotes is not None else 0)
        outside = bare[(before & 1) == 0]
        if outside.size:
            self.unreliable = (
                f"a bare carriage return ends a record at byte {off + int(outside[0])} (the "
                "scan splits records at line feeds only)"
            )


@dataclass
class ChunkCutter:
    """Cuts a file's records into chunks ``(start, stop, rows)``, fed record ends in order.

    A chunk closes at the first record end where it holds ``max_rows`` rows or spans
    ``max_bytes`` bytes, whichever comes first (so it may exceed ``max_bytes`` by one record).

    Attributes:
        start: where the first chunk starts (after a CSV header).
        max_rows: rows per chunk, or ``None``.
        max_bytes: bytes per chunk, or ``None``.
    """

    start: int
    max_rows: int | None
    max_bytes: int | None

    def __post_init__(self) -> None:
        self.chunks: list[tuple[int, int, int]] = []
        self.rows = 0  # rows of the open chunk
        self.total_rows = 0

    def feed(self, ends: np.ndarray) -> None:
        """Record ends (file offsets one past each record), ascending."""
        n = int(ends.size)
        self.total_rows += n
        i = 0
        while i < n:
            k = n
            if self.max_rows is not None:
                k = min(k, i + self.max_rows - self.rows - 1)
            if self.max_bytes is not None:
                k = min(k, i + int(np.searchsorted(ends[i:], self.start + self.max_bytes)))
            if k >= n:
                self.rows += n - i
                break
            stop = int(ends[k])
            self.chunks.append((self.start, stop, self.rows + k - i + 1))
            self.start, self.rows, i = stop, 0, k + 1

    def finish(self, size: int) -> list[tuple[int, int, int]]:
        """The chunks; the last one runs to ``size`` (trailing blank lines included)."""
        if self.rows:
            self.chunks.append((self.start, size, self.rows))
        elif self.chunks:
            start, _, rows = self.chunks[-1]
            self.chunks[-1] = (start, size, rows)
        return self.chunks


def open_decompressed(path: str, codec: str, fs: FileSystemSpec) -> pa.NativeFile:
    """A stream of ``path``'s decompressed bytes."""
    url = fs.url(path)

    def opened() -> pa.NativeFile:
        raw = fs.open_input_stream(path)
        if codec == "xz":
            return pa.PythonFile(lzma.LZMAFile(raw), mode="r")
        return pa.CompressedInputStream(raw, codec)

    try:
        return fs.request(opened, what=url)
    except OSError as exc:
        raise translate_os_error(exc, url) from exc


def read_head(path: str, file_size: int, fs: FileSystemSpec, size: int) -> tuple[bytes, bool]:
    """The first ``size`` bytes of ``path`` (decompressed, for a compressed file), and whether
    that is all of it."""
    codec = compression_of(path)
    if codec is None:
        n = min(file_size, size)
        return (read_range(path, 0, n, fs) if n else b""), n == file_size
    stream = open_decompressed(path, codec, fs)
    try:
        with parsing(fs.url(path), kind=f"a readable {codec} file"):
            data = bytes(stream.read(size))
            return data, len(data) < size or not stream.read(1)
    finally:
        stream.close()


def read_ranges(
    path: str, size: int, fs: FileSystemSpec, *, read_bytes: int, codec: str | None
) -> Iterator[bytes]:
    """The bytes of ``path``, ``read_bytes`` at a time: range reads through ``fs`` (each
    retried), or a decompressing stream for a compressed file."""
    url = fs.url(path)
    if codec is not None:
        stream = open_decompressed(path, codec, fs)
        try:
            while True:
                with parsing(url, kind=f"a readable {codec} file"):
                    data = stream.read(read_bytes)
                if not data:
                    return
                yield bytes(data)
        finally:
            stream.close()
    for offset in range(0, size, read_bytes):
        try:
            yield fs.read_range(path, offset, min(read_bytes, size - offset))
        except OSError as exc:
            raise translate_os_error(exc, url) from exc
