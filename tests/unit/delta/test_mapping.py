"""Column mapping: file columns found by physical name or field id, nested fields renamed,
missing fields null, narrower types cast."""

from __future__ import annotations

import json

import pyarrow as pa
import pytest

from torch_dataloader_utils.delta.mapping import file_columns, parse_fields, to_logical
from torch_dataloader_utils.errors import SchemaMismatchError


def _field(name: str, typ: object, fid: int) -> dict[str, object]:
    meta = {"delta.columnMapping.id": fid, "delta.columnMapping.physicalName": f"col-{fid}"}
    return {"name": name, "type": typ, "nullable": True, "metadata": meta}


INNER = {"type": "struct", "fields": [_field("a", "long", 3), _field("b", "string", 4)]}
SCHEMA = json.dumps(
    {
        "type": "struct",
        "fields": [
            _field("id", "long", 1),
            _field("s", {"type": "array", "elementType": INNER, "containsNull": True}, 2),
            _field("n", "integer", 5),
        ],
    }
)


def _id(fid: int) -> dict[bytes, bytes]:
    return {b"PARQUET:field_id": str(fid).encode()}


def test_file_columns_by_physical_name_or_field_id() -> None:
    assert [f.physical for f in parse_fields(SCHEMA)] == ["col-1", "col-2", "col-5"]
    physical = pa.schema(
        [pa.field("col-1", pa.int64()), pa.field("other", pa.int32(), metadata=_id(5))]
    )
    assert file_columns(physical, SCHEMA, ("id", "n", "s"), "name") == {
        "id": "col-1",
        "n": None,
        "s": None,
    }
    assert file_columns(physical, SCHEMA, ("id", "n"), "id") == {"id": "col-1", "n": "other"}
    plain = pa.schema([pa.field("id", pa.int64())])
    assert file_columns(plain, SCHEMA, ("id",), None) == {"id": "id"}


def test_nested_fields_are_renamed_and_missing_ones_null() -> None:
    inner = pa.struct([pa.field("col-4", pa.string()), pa.field("col-9", pa.int8())])  # no a
    data = pa.array([[{"col-4": "x", "col-9": 1}, None], None, []], pa.list_(inner)).slice(0, 3)
    target = pa.list_(pa.struct([pa.field("a", pa.int64()), pa.field("b", pa.string())]))
    delta_type = {"type": "array", "elementType": INNER, "containsNull": True}
    got = to_logical(data, delta_type, target, "name", "f")
    assert got.type == target
    assert got.to_pylist() == [[{"a": None, "b": "x"}, None], None, []]
    sliced = to_logical(data.slice(1), delta_type, target, "name", "f")
    assert sliced.to_pylist() == [None, []]


def test_narrower_types_are_cast_and_impossible_ones_refused() -> None:
    assert (
        to_logical(pa.array([1, 2], pa.int32()), "long", pa.int64(), None, "f").type == pa.int64()
    )
    with pytest.raises(SchemaMismatchError, match="f: a column"):
        to_logical(pa.array(["x"]), "long", pa.int64(), None, "f")
