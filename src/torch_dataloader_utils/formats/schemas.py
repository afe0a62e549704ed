"""Checking that the files of a source agree on the schema of the columns read."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import pyarrow as pa

from ..errors import (
    ColumnNotFoundError,
    SchemaMismatchError,
    UnsupportedFileError,
    UnsupportedTypeError,
)
from ..fs import FileSystemSpec, ListedFile
from ..planning.plan import portable_schema
from .base import ReadOptions

__all__ = ["FileSchema", "check_readable", "check_schemas", "nullable", "project"]


@dataclass(frozen=True)
class FileSchema:
    """A file's schema, and whether the file has rows to read (a file without any is moot)."""

    schema: pa.Schema
    has_rows: bool


# Types whose arrays pyarrow cannot wrap for Python (``RecordBatch.column`` raises KeyError).
_NO_PYTHON_ARRAY = ("month_interval", "day_time_interval")


def _unreadable(t: pa.DataType) -> str | None:
    """Why pyarrow cannot hand values of type ``t`` to Python, or None."""
    if str(t) in _NO_PYTHON_ARRAY:
        return f"pyarrow has no Python array class for {t} (month_day_nano intervals it has)"
    for i in range(t.num_fields):
        reason = _unreadable(t.field(i).type)
        if reason is not None:
            return reason
    if pa.types.is_dictionary(t):
        return _unreadable(t.value_type)
    if isinstance(t, pa.BaseExtensionType):
        return _unreadable(t.storage_type)
    return None


def _repeated_field(t: pa.DataType) -> str | None:
    """A field name that a struct inside ``t`` repeats, or None (values become dicts)."""
    if pa.types.is_struct(t):
        names: list[str] = [t.field(i).name for i in range(t.num_fields)]
        repeated = next((n for n in names if names.count(n) > 1), None)
        if repeated is not None:
            return repeated
    for i in range(t.num_fields):
        found = _repeated_field(t.field(i).type)
        if found is not None:
            return found
    return None


def check_readable(schema: pa.Schema, where: str) -> None:
    """Refuse, at planning, a schema the library cannot read in full: duplicate column names
    (columns are selected and keyed by name; the formats that rename repeated names,
    `names`, never hand these over), struct fields that repeat a name (values become dicts),
    or types pyarrow cannot expose to Python.

    Raises:
        UnsupportedFileError: two columns, or two fields of a struct, share a name.
        UnsupportedTypeError: a column's type (or a type inside it) cannot be read.
    """
    seen: set[str] = set()
    for field in schema:
        if field.name in seen:
            raise UnsupportedFileError(
                f"{where}: two columns are named {field.name!r}; columns are read by name, so "
                "duplicate names are not supported (rename one when writing the file)"
            )
        seen.add(field.name)
        repeated = _repeated_field(field.type)
        if repeated is not None:
            raise UnsupportedFileError(
                f"{where}: column {field.name!r} holds a struct with two fields named "
                f"{repeated!r}; its values become dicts keyed by field name, so this is not "
                "supported (rename one when writing the file)"
            )
        reason = _unreadable(field.type)
        if reason is not None:
            raise UnsupportedTypeError(
                f"{where}: column {field.name!r} of type {field.type} cannot be read: {reason}"
            )


def nullable(schema: pa.Schema) -> pa.Schema:
    return pa.schema([field.with_nullable(True) for field in schema])


def project(schema: pa.Schema, columns: tuple[str, ...] | None) -> pa.Schema:
    if columns is None:
        return schema
    return pa.schema([schema.field(c) for c in columns])


def check_schemas(
    files: Sequence[ListedFile],
    facts: Sequence[FileSchema],
    fs: FileSystemSpec,
    options: ReadOptions,
) -> pa.Schema:
    """The schema of the columns read, the same in every file that has rows to read, in its
    portable form (`portable_schema`).

    Raises:
        ColumnNotFoundError: a requested column is in no file.
        SchemaMismatchError: a file lacks a requested column another has, or files disagree on
            the types of the columns read (nullability aside).
    """
    columns = options.columns
    if columns is not None:
        missing = [c for c in columns if all(c not in f.schema.names for f in facts)]
        if missing:
            raise ColumnNotFoundError(
                f"column(s) {missing} not found in {fs.url(files[0].path)}; "
                f"available columns: {facts[0].schema.names}"
            )
    reference: pa.Schema | None = None
    reference_file = ""
    pairs = list(zip(files, facts, strict=True))
    # Files with rows first: a file without rows to read contributes nothing, so its schema is
    # moot (it is only the reference when no file has rows).
    ordered = [p for p in pairs if p[1].has_rows] or pairs[:1]
    for f, fact in ordered:
        if columns is not None and any(c not in fact.schema.names for c in columns):
            absent = [c for c in columns if c not in fact.schema.names]
            having = next(g for g, other in pairs if any(c in other.schema.names for c in absent))
            raise SchemaMismatchError(
                f"{fs.url(f.path)}: has no column(s) {absent}, which {fs.url(having.path)} has"
            )
        # Nullability is not compared: a file whose writer marked a column non-nullable holds
        # the same values as one that did not. Nor the names pickle gives children: a file's
        # facts may have crossed processes (ranks, kept plans) and another's not.
        projected = portable_schema(nullable(project(fact.schema, columns).remove_metadata()))
        if reference is None:
            reference, reference_file = projected, fs.url(f.path)
        elif not projected.equals(reference):
            raise SchemaMismatchError(
                f"{fs.url(f.path)} and {reference_file} disagree on the schema of the columns "
                f"read:\n{fs.url(f.path)}:\n{projected}\n{reference_file}:\n{reference}"
            )
    assert reference is not None  # files is never empty here
    return reference
