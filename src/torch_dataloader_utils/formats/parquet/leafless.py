"""Parquet columns with no leaf columns: an empty struct (``struct<>``), or a struct or list of
nothing but empty structs (``struct<inner: struct<>>``, ``list<struct<>>``).

No common writer makes them (pyarrow, polars and duckdb refuse to), but a footer may declare
them. Such a column stores nothing: no leaf, so no values and no null levels. pyarrow's
``ParquetFile.iter_batches`` leaves it out of its batches without a word, while its reference
reader (``pq.read_table``, the dataset API) gives it as nulls of its type. Planning finds them,
and reading puts them back as those nulls: a column is never dropped. A column that has leaf
columns *and* an empty struct among them pyarrow cannot read at all ("non-leaf node has no
children"): planning refuses it, naming the file and the column.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import pyarrow as pa

from ...errors import UnsupportedFileError
from ..base import ReadOptions

__all__ = [
    "ParquetReadOptions",
    "check_empty_structs",
    "leaf_count",
    "put_back",
    "read_options",
    "unreadable_columns",
]


@dataclass(frozen=True)
class ParquetReadOptions(ReadOptions):
    """`ReadOptions` of a planned Parquet read.

    Attributes:
        leafless: the schema of the plan's columns, when some of them have no leaf columns
            (`put_back` adds those to each batch as nulls); ``None`` when every one has leaves.
    """

    leafless: pa.Schema | None = None


def leaf_count(t: pa.DataType) -> int:
    """The Parquet leaf columns a column of type ``t`` is stored in."""
    if pa.types.is_struct(t):
        return sum(leaf_count(t.field(k).type) for k in range(t.num_fields))
    if pa.types.is_map(t):
        return leaf_count(t.key_type) + leaf_count(t.item_type)
    if _is_list(t):
        return leaf_count(t.value_type)
    return 1


def _is_list(t: pa.DataType) -> bool:
    """A list of any kind: one Parquet repeated level over its values' leaves (a list view, read
    back from the file's Arrow schema, is stored as a list)."""
    return bool(
        pa.types.is_list(t)
        or pa.types.is_large_list(t)
        or pa.types.is_fixed_size_list(t)
        or pa.types.is_list_view(t)
        or pa.types.is_large_list_view(t)
    )


def _empty_struct(t: pa.DataType, path: str) -> str | None:
    """The path of a ``struct<>`` inside type ``t`` (at ``path``), or None."""
    if pa.types.is_struct(t):
        if t.num_fields == 0:
            return path
        for k in range(t.num_fields):
            found = _empty_struct(t.field(k).type, f"{path}.{t.field(k).name}")
            if found is not None:
                return found
    elif pa.types.is_map(t):
        return _empty_struct(t.key_type, f"{path}.key") or _empty_struct(
            t.item_type, f"{path}.value"
        )
    elif _is_list(t):
        return _empty_struct(t.value_type, f"{path}.element")
    return None


def unreadable_columns(schema: pa.Schema) -> dict[str, str]:
    """The columns of ``schema`` that have leaf columns and an empty struct among them, each
    with the path of that struct (worked out once per distinct schema: `facts`)."""
    found = {}
    for field in schema:
        if leaf_count(field.type):  # a column without leaves is read as nulls (`put_back`)
            inside = _empty_struct(field.type, field.name)
            if inside is not None:
                found[field.name] = inside
    return found


def check_empty_structs(
    unreadable: dict[str, str], schema: pa.Schema, columns: tuple[str, ...] | None, url: str
) -> None:
    """Refuse to read a column of `unreadable_columns`.

    Raises:
        UnsupportedFileError: such a column is read (pyarrow cannot decode it).
    """
    for name, inside in unreadable.items():
        if columns is None or name in columns:
            raise UnsupportedFileError(
                f"{url}: column {name!r} of type {schema.field(name).type} holds an empty "
                f"struct ({inside}) beside other fields; pyarrow cannot read such a column "
                "(a Parquet group without children), so neither can the library: leave it "
                "out with columns=[...]"
            )


def read_options(options: ReadOptions, schema: pa.Schema) -> ParquetReadOptions | None:
    """The options reads of a plan need when a column of ``schema`` (the columns read) has no
    leaf columns; ``None`` (the plan's options, unchanged) otherwise."""
    if all(leaf_count(field.type) for field in schema):
        return None
    return ParquetReadOptions.of(options, leafless=schema)


def put_back(
    batches: Iterator[pa.RecordBatch], columns: tuple[str, ...] | None, schema: pa.Schema
) -> Iterator[pa.RecordBatch]:
    """``batches`` of ``columns`` (``None``: all of ``schema``, the plan's columns) with the
    leafless ones that pyarrow left out put back as nulls of their type, in order: what
    ``pq.read_table`` gives for them."""
    names = list(columns) if columns is not None else schema.names
    for batch in batches:
        if batch.num_columns == len(names):
            yield batch  # none of the columns read is leafless
            continue
        arrays = []
        fields = []
        for name in names:
            index = batch.schema.get_field_index(name)
            if index >= 0:
                arrays.append(batch.column(index))
                fields.append(batch.schema.field(index))
            elif name in schema.names:
                field = schema.field(name)
                arrays.append(pa.nulls(batch.num_rows, field.type))
                fields.append(field)
        yield pa.RecordBatch.from_arrays(
            arrays, schema=pa.schema(fields, metadata=batch.schema.metadata)
        )
