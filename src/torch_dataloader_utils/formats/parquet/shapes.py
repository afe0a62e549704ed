"""Footers of one shape: the footer walk (`footer`) skipped where a footer differs from one
walked before only in the values of its integers and the bytes of its strings.

Files one writer wrote with one schema have footers of one shape: the same fields, lists and
string lengths in the same places, only row counts, sizes, offsets and statistics differ. The
walk's path through the bytes depends on the field headers, list and string lengths, and on
where each varint ends (its bytes' high bits), never on an integer's value or a string's
bytes. So a footer whose bytes equal a known shape's in every such place is walked as that
shape was, and its kept integers are read at the shape's offsets: a footer parsed and checked
in 5.6 µs against 18 with the walk (docs/benchmarks.md#planning-footers-of-one-shape).

A shape is learned from a footer that parsed and passed every check (`learn`), by a second walk
that marks each byte as structure, a varint's value or a string's bytes, and notes where the
kept integers lie; it is kept only where the integers read at those offsets rebuild exactly
what the walk found. A footer repeating a field, or holding a map, is not learned.
"""

from __future__ import annotations

from typing import Any

from .thrift import (
    BINARY,
    BYTE,
    DOUBLE,
    FALSE,
    I16,
    I64,
    LIST,
    MAX_DEPTH,
    SET,
    STOP,
    STRUCT,
    TRUE,
    ThriftError,
    list_header,
    varint,
    zigzag,
)

__all__ = ["clear", "learn", "walked"]

# What the walk returns (`footer._file_meta`): the fields kept, the spans of their values, and
# the position after the struct.
Walked = tuple[dict[int, Any], list[tuple[int, int]], int]
# Where a shape's kept integers lie: (offset, bytes) by where the walk keeps them (`_kept`).
Where = dict[tuple[Any, ...], tuple[int, int]]

# ColumnMetaData's integer fields the walk keeps, by id, and their slot (`footer._META_FIELDS`).
META_SLOTS = {4: 0, 6: 1, 7: 2, 9: 3, 11: 4, 5: 5}
# Shapes kept per footer length (files of a few shapes interleaved), lengths kept, and the
# longest footer learned: past it the bytes' comparison is no longer cheap against the walk.
_PER_LENGTH = 4
_LENGTHS = 16
_LONGEST = 64 << 10
# A varint's value bytes may differ but in their high bit; a string's or double's bytes freely.
_VALUE, _CONTENT = 0x7F, 0xFF
_INVERTED = bytes(255 - b for b in range(256))


class _Shape:
    """A footer's shape: its bytes (``bits``), the bits a footer of the shape has as they are
    (``fixed``), and the walk's result with the offset and length of each integer it keeps
    (``rows``, and each row group's rows and columns), to be read again from another footer.

    Raises:
        KeyError: the walk kept an integer the second walk did not place (never learned).
    """

    __slots__ = ("bits", "end", "fixed", "groups", "rows", "spans")

    def __init__(self, thrift: bytes, free: bytearray, walk: Walked, where: Where) -> None:
        meta, self.spans, self.end = walk
        self.bits = int.from_bytes(thrift, "little")
        self.fixed = int.from_bytes(free.translate(_INVERTED), "little")
        self.rows = where[("rows",)] if 3 in meta else None
        groups: list[tuple[Any, Any]] = []
        for i, group in enumerate(meta[4]):
            columns = None
            if 1 in group:
                columns = []
                for j, (found, encrypted) in enumerate(group[1]):
                    kept = [
                        (slot, *where[("column", i, j, slot)])
                        for slot in range(len(META_SLOTS))
                        if found is not None and found[slot] is not None
                    ]
                    columns.append((None if found is None else tuple(found), kept, encrypted))
            groups.append((where[("group", i)] if 3 in group else None, columns))
        self.groups = groups

    def rebuild(self, data: bytes) -> Walked:
        """The walk's result for ``data``, a footer of this shape."""
        meta: dict[int, Any] = {}
        if self.rows is not None:
            meta[3] = _integer(data, *self.rows)
        groups = []
        for rows_at, columns in self.groups:
            group: dict[int, Any] = {}
            if columns is not None:
                chunks: list[tuple[list[Any] | None, bool]] = []
                for found, kept, encrypted in columns:
                    if found is None:
                        chunks.append((None, encrypted))
                        continue
                    values = list(found)
                    for slot, pos, n in kept:
                        values[slot] = _integer(data, pos, n)
                    chunks.append((values, encrypted))
                group[1] = chunks
            if rows_at is not None:
                group[3] = _integer(data, *rows_at)
            groups.append(group)
        meta[4] = groups
        return meta, list(self.spans), self.end


def _integer(data: bytes, pos: int, n: int) -> int:
    """The zigzag varint of ``n`` bytes at ``pos``."""
    value = data[pos]
    if n > 1:
        value &= 0x7F
        for k in range(1, n):
            value |= (data[pos + k] & 0x7F) << (7 * k)
    return (value >> 1) ^ -(value & 1)


_known: dict[int, list[_Shape]] = {}
_last = [-1]  # the length of the last footer walked
# Footers read by a shape, and shapes learned: learning costs about four walks, so past the
# first two it waits on hits (`_HITS_A_LEARNING` each) that pay for it.
_tally = [0, 0]
_HITS_A_LEARNING = 8


def walked(thrift: bytes) -> Walked | None:
    """The walk's result for ``thrift`` where it has a known shape, else ``None``."""
    shapes = _known.get(len(thrift))
    if shapes is None:
        return None
    bits = int.from_bytes(thrift, "little")
    for shape in shapes:
        if not (bits ^ shape.bits) & shape.fixed:
            _tally[0] += 1
            return shape.rebuild(thrift)
    return None


def learn(thrift: bytes, walk: Walked) -> None:
    """Keep the shape of ``thrift``, walked to ``walk`` and checked, where the footer walked
    before it had its length (a footer of a shape never repeated is not worth learning) and
    the shapes learned so far have paid for themselves."""
    length = len(thrift)
    repeated, _last[0] = _last[0] == length, length
    hits, learned = _tally
    if not repeated or length > _LONGEST or 4 not in walk[0]:
        return
    if learned >= 2 and hits < learned * _HITS_A_LEARNING:
        return
    _tally[1] += 1
    free = bytearray(length)
    where: Where = {}
    try:
        end = _struct(thrift, 0, (), free=free, where=where, depth=0)
    except (_UnlearnedError, ThriftError, IndexError):  # (never, where the walk went)
        return
    if end != walk[2]:
        return
    try:
        shape = _Shape(thrift, free, walk, where)
    except KeyError:  # a kept integer the second walk did not place
        return
    if shape.rebuild(thrift) != walk:
        return
    if len(_known) >= _LENGTHS and length not in _known:
        _known.clear()
    _known[length] = [shape, *_known.get(length, [])][:_PER_LENGTH]


def clear() -> None:
    """Forget every shape (tests compare the walk with and without them)."""
    _known.clear()
    _last[0] = -1
    _tally[:] = [0, 0]


class _UnlearnedError(Exception):
    """The footer holds what shapes do not cover (a repeated field, a map)."""


def _kept(path: tuple[int, ...]) -> tuple[Any, ...] | None:
    """Where the walk keeps the integer at ``path`` (field ids and list indexes), or None."""
    if path == (3,):
        return ("rows",)
    if len(path) == 3 and path[0] == 4 and path[2] == 3:
        return ("group", path[1])
    if len(path) == 6 and path[0] == 4 and path[2] == 1 and path[4] == 3:
        slot = META_SLOTS.get(path[5])
        if slot is not None:
            return ("column", path[1], path[3], slot)
    return None


def _struct(
    data: bytes, pos: int, path: tuple[int, ...], *, free: bytearray, where: Where, depth: int
) -> int:
    """Mark the struct at ``pos``; the position after it."""
    if depth > MAX_DEPTH:
        raise _UnlearnedError
    field = 0
    seen = set()
    while True:
        head = data[pos]
        pos += 1
        kind = head & 0x0F
        if kind == STOP:
            return pos
        if head >> 4:
            field += head >> 4
        else:
            field, pos = zigzag(data, pos)
        if field in seen:
            raise _UnlearnedError
        seen.add(field)
        pos = _value(data, pos, kind, (*path, field), free=free, where=where, depth=depth)


def _value(
    data: bytes,
    pos: int,
    kind: int,
    path: tuple[int, ...],
    *,
    free: bytearray,
    where: Where,
    depth: int,
) -> int:
    """Mark the value of type ``kind`` at ``pos``; the position after it."""
    if kind in (TRUE, FALSE):  # (its value is the header's type)
        return pos
    if kind == BYTE:
        free[pos] = _CONTENT
        return pos + 1
    if I16 <= kind <= I64:
        start = pos
        while data[pos] & 0x80:
            free[pos] = _VALUE
            pos += 1
        free[pos] = _VALUE
        pos += 1
        kept = _kept(path)
        if kept is not None:
            where[kept] = (start, pos - start)
        return pos
    if kind == DOUBLE:
        free[pos : pos + 8] = bytes([_CONTENT]) * 8
        return pos + 8
    if kind == BINARY:
        n, pos = varint(data, pos)
        free[pos : pos + n] = bytes([_CONTENT]) * n
        return pos + n
    if kind in (LIST, SET):
        size, element, pos = list_header(data, pos)
        if not size:
            return pos
        if element in (TRUE, FALSE):
            return pos + size  # (a byte each, left as structure)
        if element == STOP or element > STRUCT or size > len(data) - pos:
            raise _UnlearnedError
        for i in range(size):
            pos = _value(data, pos, element, (*path, i), free=free, where=where, depth=depth + 1)
        return pos
    if kind == STRUCT:
        return _struct(data, pos, path, free=free, where=where, depth=depth + 1)
    raise _UnlearnedError  # a map, or an unknown type
