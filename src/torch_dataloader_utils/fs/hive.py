"""Hive-style ``key=value`` directory partitioning."""

from __future__ import annotations

import posixpath
import re
from collections.abc import Sequence
from urllib.parse import unquote

import pyarrow as pa

from .listing import ListedFile

__all__ = ["HIVE_NULL", "hive_partitions"]

HIVE_NULL = "__HIVE_DEFAULT_PARTITION__"


def _segments(f: ListedFile) -> dict[str, str | None]:
    relative = posixpath.relpath(posixpath.dirname(f.path), f.base)
    values: dict[str, str | None] = {}
    for part in relative.split("/"):
        key, sep, value = part.partition("=")
        if sep and key:
            value = unquote(value)
            values[unquote(key)] = None if value == HIVE_NULL else value
    return values


_INTEGER = re.compile(r"-?[0-9]+")


def _infer_type(values: Sequence[str | None]) -> pa.DataType:
    present = [v for v in values if v is not None]
    if present and all(_INTEGER.fullmatch(v) and -(2**63) <= int(v) < 2**63 for v in present):
        return pa.int64()
    return pa.string()


def hive_partitions(
    files: Sequence[ListedFile],
) -> tuple[pa.Schema, list[tuple[tuple[str, object], ...]]]:
    """Parse ``key=value`` directories of each file.

    Keys that appear under some files but not others are null for the files without them. A key
    whose values all parse as integers becomes ``int64``, otherwise ``string``.

    Returns:
        The schema of the partition columns (in order of first appearance) and, per file, its
        ``(key, value)`` pairs in schema order.
    """
    parsed = [_segments(f) for f in files]
    keys: list[str] = []
    for p in parsed:
        keys.extend(k for k in p if k not in keys)
    types = {k: _infer_type([p.get(k) for p in parsed]) for k in keys}
    schema = pa.schema([pa.field(k, types[k]) for k in keys])
    per_file: list[tuple[tuple[str, object], ...]] = []
    for p in parsed:
        row: list[tuple[str, object]] = []
        for k in keys:
            v = p.get(k)
            row.append((k, int(v) if v is not None and types[k] == pa.int64() else v))
        per_file.append(tuple(row))
    return schema, per_file
