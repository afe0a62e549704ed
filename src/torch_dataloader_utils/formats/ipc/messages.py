"""Where an Arrow IPC file's record batches are, from message headers only.

Row counts live in each record batch's message header, not in the file footer, and pyarrow
decodes (and decompresses) a whole batch to tell its rows. The few flatbuffer fields needed
(Message and Footer) are read here with a minimal reader, `_READ_BYTES` bytes at a time, so
small batches cost few requests on object storage.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from dataclasses import dataclass

import pyarrow as pa
from pyarrow import ipc

from ...errors import CorruptFileError
from ...fs import FileSystemSpec
from ...fs.ranges import RangeFile
from ..opening import parsing, read_range

__all__ = ["KIND", "MAGIC", "RECORD_BATCH", "Headers", "Message", "read_headers"]

KIND = "a readable Arrow IPC file or stream"
MAGIC = b"ARROW1"
_FEATHER_V1 = b"FEA1"
_CONTINUATION = 0xFFFFFFFF
# Message header types (Message.fbs MessageHeader).
_SCHEMA, _DICTIONARY, RECORD_BATCH = 1, 2, 3
# Footers and message headers are read this many bytes at a time: one request serves every
# header inside them.
_READ_BYTES = 256 << 10
# Files with messages reading never decodes are decoded whole at planning up to this size.
_CHECK_WHOLE = 16 << 20
_CHECK_BODY = 1 << 20


# --- a minimal flatbuffer reader: the few fields of Message and Footer read here ---------------


def _unpack(fmt: str, data: bytes, pos: int) -> int:
    if pos < 0 or pos + struct.calcsize(fmt) > len(data):
        raise ValueError(f"flatbuffer offset {pos} outside its {len(data)} bytes")
    value: int = struct.unpack_from(fmt, data, pos)[0]
    return value


class _Table:
    """A flatbuffer table at ``pos`` of ``data``."""

    def __init__(self, data: bytes, pos: int) -> None:
        self.data, self.pos = data, pos
        self.vtable = pos - _unpack("<i", data, pos)
        self.vtable_size = _unpack("<H", data, self.vtable)

    def field(self, index: int) -> int | None:
        """Position of field ``index`` (``None``: absent, the default value)."""
        entry = 4 + 2 * index
        if entry + 2 > self.vtable_size:
            return None
        offset = _unpack("<H", self.data, self.vtable + entry)
        return self.pos + offset if offset else None

    def scalar(self, index: int, fmt: str) -> int:
        pos = self.field(index)
        return 0 if pos is None else _unpack(fmt, self.data, pos)

    def table(self, index: int) -> _Table | None:
        pos = self.field(index)
        return None if pos is None else _Table(self.data, pos + _unpack("<I", self.data, pos))

    def vector(self, index: int) -> tuple[int, int]:
        """``(position of the first element, length)``; an absent vector is empty."""
        pos = self.field(index)
        if pos is None:
            return 0, 0
        start = pos + _unpack("<I", self.data, pos)
        return start + 4, _unpack("<I", self.data, start)


def _root(data: bytes) -> _Table:
    return _Table(data, _unpack("<I", data, 0))


@dataclass(frozen=True)
class Message:
    offset: int  # of the encapsulated message (its length prefix)
    size: int  # prefix, metadata and body
    kind: int  # _SCHEMA, _DICTIONARY, RECORD_BATCH, ...
    rows: int  # of a record batch


def _header(metadata: bytes) -> tuple[int, int, int]:
    """``(header type, rows, body length)`` of a Message flatbuffer."""
    message = _root(metadata)
    kind = message.scalar(1, "<B")  # header_type (the union's type field)
    body = message.scalar(3, "<q")
    rows = 0
    if kind == RECORD_BATCH:
        batch = message.table(2)
        rows = 0 if batch is None else batch.scalar(0, "<q")
    if body < 0 or rows < 0:
        raise ValueError(f"negative body length {body} or row count {rows}")
    return kind, rows, body


def _footer_blocks(footer: bytes, index: int) -> list[tuple[int, int, int]]:
    """``(offset, metadata length, body length)`` of the Footer's dictionaries (``index`` 2)
    or record batches (3)."""
    start, length = _root(footer).vector(index)
    blocks = []
    for k in range(length):
        at = start + 24 * k  # struct Block { offset: long; metaDataLength: int; bodyLength: long }
        blocks.append(
            (
                _unpack("<q", footer, at),
                _unpack("<i", footer, at + 8),
                _unpack("<q", footer, at + 16),
            )
        )
    return blocks


# --- reading headers, `_READ_BYTES` at a time -----------------------------------------------------


class _Reader:
    """Byte ranges of one file, read `_READ_BYTES` bytes at a time."""

    def __init__(self, path: str, size: int, fs: FileSystemSpec) -> None:
        self.path, self.size, self.fs = path, size, fs
        self.start, self.data = 0, b""

    def fetch(self, offset: int, n: int) -> bytes:
        return read_range(self.path, offset, n, self.fs)  # storage errors typed, not parsed

    def read(self, offset: int, n: int) -> bytes:
        if offset < 0 or offset + n > self.size:
            raise ValueError(f"needs bytes {offset}:{offset + n}, past the end ({self.size} bytes)")
        if not (self.start <= offset and offset + n <= self.start + len(self.data)):
            self.start = offset
            self.data = self.fetch(offset, min(max(n, _READ_BYTES), self.size - offset))
        return self.data[offset - self.start : offset - self.start + n]

    def tail(self) -> None:
        """Load the last `_READ_BYTES` bytes (where a footer is)."""
        self.start = max(0, self.size - _READ_BYTES)
        self.data = self.fetch(self.start, self.size - self.start)


def _message_at(reader: _Reader, offset: int) -> tuple[int, int, int, int] | None:
    """``(prefix + metadata length, kind, rows, body length)`` of the message at ``offset``;
    ``None`` at the end-of-stream marker (or the end of the bytes)."""
    if offset == reader.size:
        return None  # a stream without its end-of-stream marker
    first = _unpack("<I", reader.read(offset, 4), 0)
    prefix = 4
    if first == _CONTINUATION:
        first, prefix = _unpack("<I", reader.read(offset + 4, 4), 0), 8
    if first == 0:
        return None
    kind, rows, body = _header(reader.read(offset + prefix, first))
    return prefix + first, kind, rows, body


@dataclass(frozen=True)
class Headers:
    """What a file's message headers tell: its schema, and where its record batches (and a
    stream's other messages) are."""

    schema: pa.Schema
    stream: bool  # the stream format (no footer)
    batches: list[Message]
    messages: list[Message]  # stream format: every message, in order; the schema's first


def _file_headers(reader: _Reader, fetch: Callable[[int, int], bytes]) -> Headers:
    reader.tail()
    if not reader.data.endswith(MAGIC) or reader.size < 2 * len(MAGIC) + 6:
        raise ValueError(
            f"starts with the IPC file magic but does not end with it ({reader.size} bytes): "
            "truncated, or still being written"
        )
    file = RangeFile(reader.size, {reader.start: reader.data}, fetch)
    schema = ipc.open_file(file.arrow()).schema  # validates the footer
    footer_size = _unpack("<i", reader.read(reader.size - 10, 4), 0)
    footer = reader.read(reader.size - 10 - footer_size, footer_size)
    batches = []
    for offset, meta, body in _footer_blocks(footer, 3):
        found = _message_at(reader, offset)
        if found is None or found[1] != RECORD_BATCH or found[0] > meta:
            raise ValueError(f"the footer's record batch at byte {offset} is not one")
        if offset + meta + body > reader.size:
            raise ValueError(f"record batch at byte {offset} runs past the end")
        batches.append(Message(offset, meta + body, RECORD_BATCH, found[2]))
    return Headers(schema.remove_metadata(), False, batches, [])


def _stream_headers(reader: _Reader) -> Headers:
    messages = []
    offset = 0
    while (found := _message_at(reader, offset)) is not None:
        head, kind, rows, body = found
        if offset + head + body > reader.size:
            raise ValueError(f"message at byte {offset} runs past the end (truncated)")
        messages.append(Message(offset, head + body, kind, rows))
        offset += head + body
    if not messages or messages[0].kind != _SCHEMA:
        raise ValueError("the stream does not start with a schema message")
    schema = ipc.read_schema(pa.py_buffer(reader.read(0, messages[0].size)))
    batches = [m for m in messages if m.kind == RECORD_BATCH]
    return Headers(schema.remove_metadata(), True, batches, messages)


def read_headers(path: str, size: int, fs: FileSystemSpec) -> Headers:
    """Read where ``path``'s record batches are (its headers only).

    Raises:
        CorruptFileError: empty, truncated or not Arrow IPC (names the file and byte).
    """
    url = fs.url(path)
    if size == 0:
        raise CorruptFileError(f"{url}: the file is empty (0 bytes), not an Arrow IPC file")
    reader = _Reader(path, size, fs)
    head = reader.read(0, min(8, size))
    if head.startswith(_FEATHER_V1):
        raise CorruptFileError(
            f"{url}: a Feather v1 file, which is not read; convert it to Feather v2 (the Arrow "
            "IPC file format): pyarrow.feather.write_feather(pyarrow.feather.read_table(src), dst)"
        )
    with parsing(url, KIND):
        try:
            if head.startswith(MAGIC):
                headers = _file_headers(reader, reader.fetch)
            else:
                headers = _stream_headers(reader)
            _check_unread(headers, reader)
            return headers
        except (ValueError, IndexError) as exc:
            raise CorruptFileError(f"{url}: not {KIND} ({exc})") from exc


def _check_unread(headers: Headers, reader: _Reader) -> None:
    """Check what reading never decodes: zero-row record batches, and (streams) dictionaries
    after the last batch with rows. Reading decodes every other message with pyarrow, which
    checks it then; these would pass unchecked (fuzzed streams hide corrupt messages there).
    A file of at most `_CHECK_WHOLE` bytes is decoded whole by pyarrow's reader; a larger
    one has each such message's metadata checked by pyarrow's flatbuffer verifier (those
    with a body of at most `_CHECK_BODY` bytes: the body is stood in for by zeros)."""
    last = max((i for i, m in enumerate(headers.messages) if m.rows), default=-1)
    unread = [b for b in headers.batches if not b.rows]
    if headers.stream:
        unread += [m for m in headers.messages[last + 1 :] if m.kind == _DICTIONARY]
    if not unread:
        return
    if reader.size <= _CHECK_WHOLE:
        data = pa.py_buffer(reader.read(0, reader.size))
        if headers.stream:
            ipc.open_stream(data).read_all()
        else:
            ipc.open_file(data).read_all()
        return
    for message in unread:
        head = _message_at(reader, message.offset)
        assert head is not None
        if message.size - head[0] > _CHECK_BODY:
            continue
        metadata = reader.read(message.offset, head[0])
        body = bytes(message.size - head[0])  # the metadata is what is checked
        ipc.read_message(pa.py_buffer(metadata + body))
