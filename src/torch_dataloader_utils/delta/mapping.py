"""Column mapping: a Delta data file's columns matched to the table's logical columns.

Without column mapping a file's columns carry the table's names. With
``delta.columnMapping.mode`` ``"name"``, each field (nested ones too) has a physical name
(``delta.columnMapping.physicalName`` in the schema's field metadata) that files use; with
``"id"``, files are matched by the Parquet field id (``delta.columnMapping.id``), the physical
name serving files written without ids. Batches come out under the logical names and types:
a field the file lacks is null, a narrower type (type widening) is cast.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from ..errors import SchemaMismatchError

__all__ = ["DeltaField", "file_columns", "parse_fields", "plain_schema", "to_logical"]

_PHYSICAL = "delta.columnMapping.physicalName"
_ID = "delta.columnMapping.id"
_FIELD_ID = b"PARQUET:field_id"


@dataclass(frozen=True)
class DeltaField:
    """A field of the table's schema, as files name it.

    Attributes:
        name: its logical name.
        physical: its name in data files.
        field_id: its column mapping id (``None``: no column mapping).
        type: its Delta type (JSON), whose nested fields are matched the same way.
    """

    name: str
    physical: str
    field_id: int | None
    type: Any


def _field(entry: dict[str, Any]) -> DeltaField:
    meta = entry.get("metadata") or {}
    found = meta.get(_ID)
    return DeltaField(
        entry["name"],
        str(meta.get(_PHYSICAL, entry["name"])),
        None if found is None else int(found),
        entry["type"],
    )


@lru_cache(maxsize=16)
def parse_fields(schema_json: str) -> tuple[DeltaField, ...]:
    """The top-level fields of a Delta schema (its JSON)."""
    return tuple(_field(f) for f in json.loads(schema_json)["fields"])


def _plain(t: pa.DataType) -> pa.DataType:
    """``t`` without field metadata at any depth."""
    if pa.types.is_struct(t):
        return pa.struct([_plain_field(t.field(i)) for i in range(t.num_fields)])
    if pa.types.is_large_list(t):
        return pa.large_list(_plain_field(t.value_field))
    if pa.types.is_list(t):
        return pa.list_(_plain_field(t.value_field))
    if pa.types.is_map(t):
        return pa.map_(_plain_field(t.key_field), _plain_field(t.item_field))
    return t


def _plain_field(f: pa.Field) -> pa.Field:
    return pa.field(f.name, _plain(f.type), f.nullable)


def plain_schema(schema: pa.Schema) -> pa.Schema:
    """``schema`` without field metadata at any depth (deltalake's carries column mapping's, in
    an order that changes between calls: the plan's fingerprint must not)."""
    return pa.schema([_plain_field(f) for f in schema])


def _file_id(field: pa.Field) -> int | None:
    value = (field.metadata or {}).get(_FIELD_ID)
    return None if value is None else int(value)


def _match(fields: list[pa.Field], wanted: DeltaField, mode: str | None) -> int | None:
    """The index of ``wanted`` among a file's ``fields`` (``None``: the file lacks it)."""
    if mode == "id" and wanted.field_id is not None:
        for i, f in enumerate(fields):
            if _file_id(f) == wanted.field_id:
                return i
    name = wanted.physical if mode else wanted.name
    for i, f in enumerate(fields):
        if f.name == name:
            return i
    return None


def file_columns(
    physical: pa.Schema, schema_json: str, columns: tuple[str, ...], mode: str | None
) -> dict[str, str | None]:
    """Each of ``columns`` (logical names) as the file's top-level column (``None``: the file
    lacks it)."""
    fields = list(physical)
    by_name = {f.name: f for f in parse_fields(schema_json)}
    out: dict[str, str | None] = {}
    for column in columns:
        i = _match(fields, by_name[column], mode)
        out[column] = None if i is None else fields[i].name
    return out


def to_logical(
    array: pa.Array, delta_type: Any, target: pa.DataType, mode: str | None, where: str
) -> pa.Array:
    """``array`` (a file's column) in the table's logical type ``target``: nested fields matched
    by physical name or id, missing ones null, narrower types cast.

    Raises:
        SchemaMismatchError: a column cannot be cast to the table's type.
    """
    if array.type == target:
        return array
    kind = delta_type.get("type") if isinstance(delta_type, dict) else None
    if kind == "struct" and pa.types.is_struct(array.type) and pa.types.is_struct(target):
        file_fields = [array.type.field(i) for i in range(array.type.num_fields)]
        children = array.flatten()
        out = []
        for i, entry in enumerate(delta_type["fields"]):
            wanted, t = _field(entry), target.field(i).type
            j = _match(file_fields, wanted, mode)
            out.append(
                pa.nulls(len(array), t)
                if j is None
                else to_logical(children[j], wanted.type, t, mode, where)
            )
        fields = [target.field(i) for i in range(target.num_fields)]
        mask = array.is_null() if array.null_count else None
        return pa.StructArray.from_arrays(out, fields=fields, mask=mask)
    if kind == "array" and pa.types.is_list(array.type) and pa.types.is_list(target):
        offsets = array.offsets
        first, last = offsets[0].as_py(), offsets[-1].as_py()
        values = to_logical(
            array.values.slice(first, last - first),
            delta_type["elementType"],
            target.value_type,
            mode,
            where,
        )
        mask = array.is_null() if array.null_count else None
        # (Offsets from 0, unsliced: a slice's offsets cannot go with a null mask.)
        offsets = pc.subtract(offsets, pa.scalar(first, offsets.type))
        return pa.ListArray.from_arrays(offsets, values, type=target, mask=mask)
    try:
        return array.cast(target)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
        raise SchemaMismatchError(
            f"{where}: a column of type {array.type} cannot be read as the table's {target} ({exc})"
        ) from exc
