"""Columns by field id: the one module that uses pyiceberg's reading internals.

A data file's columns are matched to the table's by Iceberg field id, never by name: a renamed
column keeps its id, an added column is absent from older files (read as nulls, or as the
file's identity-partition value), a promoted type (int -> long, float -> double) is cast, and a
file written without field ids gets them from the table's ``schema.name-mapping.default``.
pyiceberg implements exactly these rules for its own reader (``ArrowScan``); this module calls
the same functions, some of them private (``_to_requested_schema``), which is why the iceberg
extra pins ``pyiceberg>=0.12,<0.13`` and tests/iceberg/test_projection.py checks each of them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import pyarrow as pa
from pyiceberg.exceptions import ResolveError
from pyiceberg.io.pyarrow import _to_requested_schema, pyarrow_to_schema, schema_to_pyarrow
from pyiceberg.schema import Schema, prune_columns
from pyiceberg.table.name_mapping import NameMapping, parse_mapping_from_json
from pyiceberg.types import ListType, MapType

from ..errors import ColumnNotFoundError, SchemaMismatchError

__all__ = [
    "FileProjection",
    "arrow_schema",
    "output_schema",
    "parse_name_mapping",
    "parse_schema",
    "project",
    "projected_schema",
    "resolve_file",
]

_CACHED = 16


@lru_cache(maxsize=_CACHED)
def parse_schema(schema_json: str) -> Schema:
    """An Iceberg schema from its JSON (cached: workers parse each one once)."""
    return Schema.model_validate_json(schema_json)


@lru_cache(maxsize=_CACHED)
def parse_name_mapping(mapping_json: str | None) -> NameMapping | None:
    """A name mapping from its JSON, or ``None``."""
    return parse_mapping_from_json(mapping_json) if mapping_json else None


@lru_cache(maxsize=_CACHED)
def projected_schema(schema_json: str, columns: tuple[str, ...] | None) -> Schema:
    """The Iceberg schema of ``columns`` (top-level names; ``None``: all) in that order.

    Raises:
        ColumnNotFoundError: a column is not in the schema.
    """
    schema = parse_schema(schema_json)
    if columns is None:
        return schema
    names = [f.name for f in schema.fields]
    missing = [c for c in columns if c not in names]
    if missing:
        raise ColumnNotFoundError(f"column(s) {missing} not in the table; columns: {names}")
    fields = [schema.find_field(c) for c in columns]
    return Schema(*fields, schema_id=schema.schema_id)


def _small(t: pa.DataType) -> pa.DataType:
    """``t`` with 32-bit offsets (string, binary, list), as Parquet reads give them."""
    if pa.types.is_large_string(t):
        return pa.string()
    if pa.types.is_large_binary(t):
        return pa.binary()
    if pa.types.is_large_list(t) or pa.types.is_list(t):
        return pa.list_(t.value_field.with_type(_small(t.value_type)).remove_metadata())
    if pa.types.is_struct(t):
        return pa.struct(
            [t.field(i).with_type(_small(t.field(i).type)) for i in range(t.num_fields)]
        )
    if pa.types.is_map(t):
        return pa.map_(
            t.key_field.with_type(_small(t.key_type)).remove_metadata(),
            t.item_field.with_type(_small(t.item_type)).remove_metadata(),
        )
    return t


def output_schema(schema: Schema) -> pa.Schema:
    """The Arrow schema batches are read in: pyiceberg's mapping of ``schema``, with 32-bit
    offsets and every top-level column nullable (as Parquet plans)."""
    arrow = schema_to_pyarrow(schema, include_field_ids=False)
    return pa.schema([pa.field(f.name, _small(f.type), nullable=True) for f in arrow])


@lru_cache(maxsize=_CACHED)
def arrow_schema(schema_json: str, columns: tuple[str, ...] | None) -> pa.Schema:
    """`output_schema` of `projected_schema` (cached: every read asks for it)."""
    return output_schema(projected_schema(schema_json, columns))


def _field_ids(schema: Schema) -> set[int]:
    """Field ids to read for ``schema`` (as ``ArrowScan``: a list or map is read through its
    element, key and value fields)."""
    return {i for i in schema.field_ids if not isinstance(schema.find_type(i), ListType | MapType)}


@dataclass(frozen=True)
class FileProjection:
    """How one data file's columns become the read schema.

    Attributes:
        columns: the file's top-level columns to decode.
        file_schema: those columns as an Iceberg schema (the file's field ids and types).
        constants: values of read columns the file lacks, by field id (identity partitions).
    """

    columns: tuple[str, ...]
    file_schema: Schema
    constants: Mapping[int, Any]


def resolve_file(
    physical: pa.Schema,
    schema: Schema,
    *,
    name_mapping: NameMapping | None,
    format_version: int,
    constants: Mapping[int, Any],
    where: str,
) -> FileProjection:
    """Match a data file's ``physical`` Arrow schema to the read ``schema`` by field id.

    Raises:
        SchemaMismatchError: the file has no field ids and the table no name mapping, or its
            schema cannot be read as Iceberg types.
    """
    try:
        file_schema = pyarrow_to_schema(
            physical,
            name_mapping,
            downcast_ns_timestamp_to_us=format_version <= 2,
            format_version=format_version,  # type: ignore[arg-type]
        )
    except ValueError as exc:
        raise SchemaMismatchError(
            f"{where}: cannot match the file's columns to the table's by field id ({exc}). A "
            "file written without field ids needs the table property "
            "schema.name-mapping.default (pyiceberg's add_files sets it)"
        ) from exc
    wanted = _field_ids(schema)
    pruned = prune_columns(file_schema, wanted, select_full_types=False)
    present = file_schema.field_ids
    missing = {i: v for i, v in constants.items() if i in schema.field_ids and i not in present}
    return FileProjection(tuple(c.name for c in pruned.columns), pruned, missing)


def project(
    batch: pa.RecordBatch,
    schema: Schema,
    projection: FileProjection,
    target: pa.Schema,
    *,
    format_version: int,
    where: str,
) -> pa.RecordBatch:
    """A batch of a file's columns (``projection.columns``) in the read ``schema``, as
    ``target`` (`output_schema`) types.

    Raises:
        SchemaMismatchError: a column cannot be read as the table's type (an incompatible
            change), or a required column is missing from the file.
    """
    try:
        out = _to_requested_schema(
            schema,
            projection.file_schema,
            batch,
            downcast_ns_timestamp_to_us=format_version <= 2,
            projected_missing_fields=dict(projection.constants),
            allow_timestamp_tz_mismatch=True,
        )
        return out if out.schema.equals(target) else out.cast(target)
    except (ResolveError, ValueError, pa.ArrowException) as exc:
        raise SchemaMismatchError(
            f"{where}: the file's columns do not read as the table's schema ({exc})"
        ) from exc
