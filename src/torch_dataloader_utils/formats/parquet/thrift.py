"""The Thrift compact protocol, as far as the footer walk (`footer`) needs it: varints, zigzag
integers, skipping any value, and the headers of integer and list-of-struct fields. Every
malformed value raises `ThriftError` (or IndexError, where the bytes end early)."""

from __future__ import annotations

__all__ = [
    "BINARY",
    "FALSE",
    "I16",
    "I32",
    "I64",
    "LIST",
    "STOP",
    "STRUCT",
    "ThriftError",
    "integer",
    "integer_field",
    "integers_field",
    "list_header",
    "skip",
    "structs",
    "varint",
    "zigzag",
]

# Thrift compact types.
STOP, TRUE, FALSE, BYTE, I16, I32, I64, DOUBLE, BINARY = range(9)
LIST, SET, MAP, STRUCT = 9, 10, 11, 12
# Nesting a footer may use (parquet's own structures nest 4 deep; statistics and logical types
# a few more); a fuzzed footer nested deeper is corrupt, never a RecursionError.
MAX_DEPTH = 32


class ThriftError(Exception):
    """The Thrift bytes do not parse."""


def varint(data: bytes, pos: int) -> tuple[int, int]:
    """The unsigned varint at ``pos`` and the position after it."""
    result = shift = 0
    while True:
        b = data[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if not b & 0x80:
            return result, pos
        shift += 7
        if shift > 70:
            raise ThriftError("a varint runs past 10 bytes")


def zigzag(data: bytes, pos: int) -> tuple[int, int]:
    n, pos = varint(data, pos)
    return (n >> 1) ^ -(n & 1), pos


def skip(data: bytes, pos: int, kind: int, depth: int) -> int:
    """The position after the value of type ``kind`` at ``pos``. Written for speed: planning
    walks every footer, and callers skip integers and strings themselves, so structs and
    lists are tested first, and a struct's integers, strings and short lists of integers are
    skipped inline (a Python call per other nested value; docs/benchmarks.md#planning-20000-files).
    An explicit stack instead of the calls measured slower."""
    if kind >= LIST and depth > MAX_DEPTH:  # (lists, sets, maps and structs nest)
        raise ThriftError("the footer nests too deep")
    if kind == STRUCT:
        while True:
            head = data[pos]
            pos += 1
            if not head & 0x0F:  # a STOP type ends the struct, whatever the id bits say
                return pos
            if not head >> 4:  # a long-form field id
                while data[pos] & 0x80:
                    pos += 1
                pos += 1
            kind = head & 0x0F
            if I16 <= kind <= I64:  # the most common fields, skipped inline
                while data[pos] & 0x80:
                    pos += 1
                pos += 1
            elif kind == BINARY:  # (statistics, names) inline too
                n = data[pos]
                if n < 0x80:
                    pos += 1 + n
                else:
                    n, pos = varint(data, pos)
                    pos += n
            elif kind == LIST and data[pos] < 0xF0 and I16 <= data[pos] & 0x0F <= I64:
                # a short list of integers (encodings, size statistics' histograms)
                size = data[pos] >> 4
                pos += 1
                for _ in range(size):
                    while data[pos] & 0x80:
                        pos += 1
                    pos += 1
            elif kind > FALSE:
                pos = skip(data, pos, kind, depth + 1)
    if kind in (LIST, SET):
        head = data[pos]
        pos += 1
        size, element = head >> 4, head & 0x0F
        if size == 15:
            size, pos = varint(data, pos)
        if element > STRUCT:
            raise ThriftError(f"unknown Thrift type {element}")
        if not size:  # fastparquet writes an empty list as 0x00, of type 0 (Thrift reads it)
            return pos
        if element == STOP:
            raise ThriftError(f"a list of {size} elements has no element type")
        if size > len(data) - pos:  # each element takes at least a byte
            raise ThriftError(f"a list claims {size} elements")
        if element in (TRUE, FALSE):
            return pos + size  # a byte each
        if I16 <= element <= I64:
            for _ in range(size):
                while data[pos] & 0x80:
                    pos += 1
                pos += 1
            return pos
        if element == BINARY:
            for _ in range(size):
                n, pos = varint(data, pos)
                pos += n
            return pos
        for _ in range(size):
            pos = skip(data, pos, element, depth + 1)
        return pos
    if kind in (TRUE, FALSE):
        return pos
    if kind == BYTE:
        return pos + 1
    if I16 <= kind <= I64:
        while data[pos] & 0x80:
            pos += 1
        return pos + 1
    if kind == DOUBLE:
        return pos + 8
    if kind == BINARY:
        n, pos = varint(data, pos)
        return pos + n
    if kind == MAP:
        size, pos = varint(data, pos)
        if size:
            if size > len(data) - pos:  # each entry takes at least two bytes
                raise ThriftError(f"a map claims {size} entries")
            types = data[pos]
            pos += 1
            for _ in range(size):
                pos = skip(data, pos, types >> 4, depth + 1)
                pos = skip(data, pos, types & 0x0F, depth + 1)
        return pos
    raise ThriftError(f"unknown Thrift type {kind}")


def integer(data: bytes, pos: int, kind: int, field: int) -> tuple[int, int]:
    if not I16 <= kind <= I64:
        raise ThriftError(f"field {field} is not an integer")
    return zigzag(data, pos)


def list_header(data: bytes, pos: int) -> tuple[int, int, int]:
    """The size and element type of the list (or set) at ``pos``, and the position of its
    first element. (`skip` decodes it inline: the walk's every list goes through there.)"""
    head = data[pos]
    pos += 1
    size, element = head >> 4, head & 0x0F
    if size == 15:
        size, pos = varint(data, pos)
    return size, element, pos


def structs(data: bytes, pos: int, kind: int) -> tuple[int, int]:
    """The size of the list of structs at ``pos``, and the position of its first element."""
    if kind != LIST:
        raise ThriftError("a list field is not a list")
    size, element, pos = list_header(data, pos)
    if not size and element <= STRUCT:  # an empty list's element type is not read (fastparquet: 0)
        return 0, pos
    if element != STRUCT:
        raise ThriftError("a list of structs holds another type")
    if size > len(data):  # each struct takes at least a byte
        raise ThriftError(f"a list claims {size} elements")
    return size, pos


def _field(data: bytes, pos: int, field: int) -> tuple[int, int, int]:
    """The header of a struct's next field after field ``field``: its type (`STOP` ends the
    struct), its id, and the position of its value."""
    head = data[pos]
    pos += 1
    if head >> 4:
        field += head >> 4
    elif head & 0x0F:
        field, pos = zigzag(data, pos)
    return head & 0x0F, field, pos


def integer_field(data: bytes, pos: int, wanted: int, depth: int) -> tuple[int | None, int]:
    """The integer field ``wanted`` of the struct at ``pos``, ``depth`` deep (``None`` when it
    has none, or holds another type), and the position after the struct."""
    found = None
    kind, field, pos = _field(data, pos, 0)
    while kind != STOP:
        if field == wanted and I16 <= kind <= I64:
            found, pos = zigzag(data, pos)
        else:
            pos = skip(data, pos, kind, depth + 1)
        kind, field, pos = _field(data, pos, field)
    return found, pos


def integers_field(
    data: bytes, pos: int, wanted: int, depth: int
) -> tuple[tuple[int, ...] | None, int]:
    """The list-of-integers field ``wanted`` of the struct at ``pos``, ``depth`` deep (``None``
    when it has none, or holds another type), and the position after the struct."""
    found = None
    kind, field, pos = _field(data, pos, 0)
    while kind != STOP:
        if field == wanted and kind == LIST and I16 <= data[pos] & 0x0F <= I64:
            size = data[pos] >> 4
            pos += 1
            if size == 15:
                size, pos = varint(data, pos)
            if size > len(data) - pos:  # each element takes at least a byte
                raise ThriftError(f"a list claims {size} elements")
            values = []
            for _ in range(size):
                value, pos = zigzag(data, pos)
                values.append(value)
            found = tuple(values)
        else:
            pos = skip(data, pos, kind, depth + 1)
        kind, field, pos = _field(data, pos, field)
    return found, pos
