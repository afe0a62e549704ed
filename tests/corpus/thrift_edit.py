"""Parquet footers edited as Thrift (compact protocol), to make files no writer we can install
writes: a struct column with no leaf columns (``struct<>``), which pyarrow, polars and duckdb
all refuse to write.

A footer decodes to a tree of `Struct` (fields as ``[id, type, value]``), `List` and `Map`
values, and encodes back byte for byte (for the footers pyarrow writes).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

_STOP, _TRUE, _FALSE, _BYTE, _I16, _I32, _I64, _DOUBLE, _BINARY = range(9)
_LIST, _SET, _MAP, _STRUCT = 9, 10, 11, 12
MAGIC = b"PAR1"


@dataclass
class Struct:
    fields: list[list[Any]] = field(default_factory=list)  # [id, compact type, value]

    def get(self, fid: int) -> Any:
        for f in self.fields:
            if f[0] == fid:
                return f[2]
        return None

    def set(self, fid: int, value: Any) -> None:
        for f in self.fields:
            if f[0] == fid:
                f[2] = value
                return
        raise KeyError(fid)

    def drop(self, fid: int) -> None:
        self.fields = [f for f in self.fields if f[0] != fid]


@dataclass
class List:
    element: int
    values: list[Any]


@dataclass
class Map:
    key: int
    value: int
    entries: list[tuple[Any, Any]]


def _varint(data: bytes, pos: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        b = data[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if not b & 0x80:
            return result, pos
        shift += 7


def _read(data: bytes, pos: int, kind: int) -> tuple[Any, int]:
    if kind in (_TRUE, _FALSE):  # a list's boolean: a byte
        return data[pos] == _TRUE, pos + 1
    if kind == _BYTE:
        return data[pos], pos + 1
    if kind in (_I16, _I32, _I64):
        n, pos = _varint(data, pos)
        return (n >> 1) ^ -(n & 1), pos
    if kind == _DOUBLE:
        return data[pos : pos + 8], pos + 8
    if kind == _BINARY:
        n, pos = _varint(data, pos)
        return data[pos : pos + n], pos + n
    if kind in (_LIST, _SET):
        head = data[pos]
        pos += 1
        size, element = head >> 4, head & 0x0F
        if size == 15:
            size, pos = _varint(data, pos)
        values = []
        for _ in range(size):
            value, pos = _read(data, pos, element)
            values.append(value)
        return List(element, values), pos
    if kind == _MAP:
        size, pos = _varint(data, pos)
        if not size:
            return Map(0, 0, []), pos
        types = data[pos]
        pos += 1
        entries = []
        for _ in range(size):
            k, pos = _read(data, pos, types >> 4)
            v, pos = _read(data, pos, types & 0x0F)
            entries.append((k, v))
        return Map(types >> 4, types & 0x0F, entries), pos
    if kind == _STRUCT:
        found = Struct()
        fid = 0
        while True:
            head = data[pos]
            pos += 1
            ftype = head & 0x0F
            if ftype == _STOP:
                return found, pos
            if head >> 4:
                fid += head >> 4
            else:
                fid, pos = _read(data, pos, _I16)
            if ftype in (_TRUE, _FALSE):  # a field's boolean lives in its header
                found.fields.append([fid, ftype, ftype == _TRUE])
                continue
            value, pos = _read(data, pos, ftype)
            found.fields.append([fid, ftype, value])
    raise ValueError(f"unknown Thrift type {kind}")


def _uvarint(n: int) -> bytes:
    out = bytearray()
    while True:
        byte, n = n & 0x7F, n >> 7
        out.append(byte | (0x80 if n else 0))
        if not n:
            return bytes(out)


def _zigzag(n: int) -> bytes:
    return _uvarint((n << 1) ^ (n >> 63))


def _write(value: Any, kind: int) -> bytes:
    if kind in (_TRUE, _FALSE):
        return bytes([_TRUE if value else _FALSE])
    if kind == _BYTE:
        return bytes([value])
    if kind in (_I16, _I32, _I64):
        return _zigzag(value)
    if kind == _DOUBLE:
        return bytes(value)
    if kind == _BINARY:
        return _uvarint(len(value)) + bytes(value)
    if kind in (_LIST, _SET):
        size = len(value.values)
        head = bytes([size << 4 | value.element]) if size < 15 else bytes([0xF0 | value.element])
        out = head + (_uvarint(size) if size >= 15 else b"")
        return out + b"".join(_write(v, value.element) for v in value.values)
    if kind == _MAP:
        if not value.entries:
            return b"\x00"
        out = _uvarint(len(value.entries)) + bytes([value.key << 4 | value.value])
        return out + b"".join(
            _write(k, value.key) + _write(v, value.value) for k, v in value.entries
        )
    if kind == _STRUCT:
        out = bytearray()
        last = 0
        for fid, declared, v in value.fields:
            ftype = (_TRUE if v else _FALSE) if declared in (_TRUE, _FALSE) else declared
            if 0 < fid - last <= 15:
                out.append((fid - last) << 4 | ftype)
            else:
                out.append(ftype)
                out += _zigzag(fid)
            last = fid
            if ftype not in (_TRUE, _FALSE):
                out += _write(v, ftype)
        out.append(_STOP)
        return bytes(out)
    raise ValueError(f"unknown Thrift type {kind}")


def decode(thrift: bytes) -> Struct:
    found, _ = _read(thrift, 0, _STRUCT)
    assert isinstance(found, Struct)
    return found


def encode(meta: Struct) -> bytes:
    return _write(meta, _STRUCT)


def footer(data: bytes) -> tuple[int, bytes]:
    """Where a Parquet file's footer starts, and its Thrift bytes."""
    length = int.from_bytes(data[-8:-4], "little")
    start = len(data) - 8 - length
    return start, data[start:-8]


def _parents(elements: list[Struct]) -> list[int]:
    """Each schema element's parent (the root's: -1), from the depth-first order and
    ``num_children`` (field 5)."""
    parents = [-1] * len(elements)
    pos = 1

    def walk(parent: int, count: int) -> None:
        nonlocal pos
        for _ in range(count):
            i = pos
            pos += 1
            parents[i] = parent
            walk(i, elements[i].get(5) or 0)

    walk(0, elements[0].get(5))
    return parents


def drop_leaves(source: Path, target: Path, names: set[bytes]) -> None:
    """``source`` written to ``target`` without its leaf columns named ``names``: each leaf's
    schema element, column chunks and column order go, and the group holding it has one child
    fewer (a group left with none is an empty struct). The data pages stay, unread."""
    data = source.read_bytes()
    start, thrift = footer(data)
    meta = decode(thrift)
    schema: List = meta.get(2)
    parents = _parents(schema.values)
    leaf_of = {}  # schema element -> leaf column index
    for i, element in enumerate(schema.values):
        if element.get(5) is None:
            leaf_of[i] = len(leaf_of)
    dropped = [i for i in leaf_of if schema.values[i].get(4) in names]
    assert dropped, f"no leaf named {names}"
    dropped_leaves = {leaf_of[i] for i in dropped}
    for i in dropped:
        parent = schema.values[parents[i]]
        parent.set(5, parent.get(5) - 1)
    schema.values = [e for i, e in enumerate(schema.values) if i not in dropped]
    for group in meta.get(4).values:
        columns: List = group.get(1)
        columns.values = [c for j, c in enumerate(columns.values) if j not in dropped_leaves]
    orders = meta.get(7)
    if orders is not None:
        orders.values = [o for j, o in enumerate(orders.values) if j not in dropped_leaves]
    kv = meta.get(5)
    if kv is not None:  # the stored Arrow schema would name the dropped leaves
        kv.values = [e for e in kv.values if e.get(1) != b"ARROW:schema"]
    new = encode(meta)
    target.write_bytes(data[:start] + new + len(new).to_bytes(4, "little") + MAGIC)
