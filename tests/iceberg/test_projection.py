"""The pyiceberg functions projection.py relies on, some private (``_to_requested_schema``):
each rule of reading by field id is checked here, so a pyiceberg upgrade that changes one
fails these tests rather than silently changing what batches hold."""

from __future__ import annotations

import pyarrow as pa
import pytest
from pyiceberg.schema import Schema
from pyiceberg.table.name_mapping import create_mapping_from_schema
from pyiceberg.types import (
    DoubleType,
    IntegerType,
    ListType,
    LongType,
    NestedField,
    StringType,
    StructType,
    TimestampType,
)

from torch_dataloader_utils import ColumnNotFoundError, SchemaMismatchError
from torch_dataloader_utils.iceberg.projection import (
    output_schema,
    parse_name_mapping,
    parse_schema,
    project,
    projected_schema,
    resolve_file,
)


def _field(name: str, type_: pa.DataType, field_id: int) -> pa.Field:
    return pa.field(name, type_, metadata={"PARQUET:field_id": str(field_id)})


def _read(
    batch: pa.RecordBatch,
    schema: Schema,
    *,
    mapping_json: str | None = None,
    constants: dict[int, object] | None = None,
) -> pa.RecordBatch:
    projection = resolve_file(
        batch.schema,
        schema,
        name_mapping=parse_name_mapping(mapping_json),
        format_version=2,
        constants=constants or {},
        where="test.parquet",
    )
    data = batch.select(list(projection.columns))
    return project(
        data, schema, projection, output_schema(schema), format_version=2, where="test.parquet"
    )


TABLE = Schema(
    NestedField(1, "id", LongType(), required=False),
    NestedField(2, "score", DoubleType(), required=False),  # renamed from "x", float -> double
    NestedField(3, "count", LongType(), required=False),  # promoted from int
    NestedField(4, "added", StringType(), required=False),  # not in the file
)

FILE = pa.record_batch(
    [
        pa.array([1, 2, 3], pa.int64()),
        pa.array([0.5, 1.5, 2.5], pa.float32()),
        pa.array([7, 8, 9], pa.int32()),
    ],
    schema=pa.schema(
        [_field("id", pa.int64(), 1), _field("x", pa.float32(), 2), _field("count", pa.int32(), 3)]
    ),
)


def test_rename_promotion_and_added_column() -> None:
    out = _read(FILE, TABLE)
    assert out.schema.names == ["id", "score", "count", "added"]
    assert out.schema.field("score").type == pa.float64()
    assert out.schema.field("count").type == pa.int64()
    assert out.column("score").to_pylist() == [0.5, 1.5, 2.5]
    assert out.column("count").to_pylist() == [7, 8, 9]
    assert out.column("added").to_pylist() == [None, None, None]


def test_only_the_columns_read_are_decoded() -> None:
    schema = projected_schema(TABLE.model_dump_json(), ("score",))
    projection = resolve_file(
        FILE.schema, schema, name_mapping=None, format_version=2, constants={}, where="f"
    )
    assert projection.columns == ("x",)  # the file's own name, by field id


def test_a_missing_column_takes_the_identity_partition_value() -> None:
    out = _read(FILE, TABLE, constants={4: "eu", 9: "unused"})
    assert out.column("added").to_pylist() == ["eu"] * 3


def test_no_physical_column_keeps_the_row_count() -> None:
    schema = projected_schema(TABLE.model_dump_json(), ("added",))
    projection = resolve_file(
        FILE.schema, schema, name_mapping=None, format_version=2, constants={}, where="f"
    )
    assert projection.columns == ()
    out = project(
        FILE.select([]), schema, projection, output_schema(schema), format_version=2, where="f"
    )
    assert out.num_rows == 3 and out.column("added").null_count == 3


def test_files_without_ids_use_the_name_mapping() -> None:
    plain = pa.record_batch({"id": [1, 2], "x": pa.array([1.0, 2.0], pa.float32())})
    old = Schema(
        NestedField(1, "id", LongType(), required=False),
        NestedField(2, "x", DoubleType(), required=False),
    )
    mapping = create_mapping_from_schema(old).model_dump_json()
    schema = projected_schema(TABLE.model_dump_json(), ("id", "score"))
    out = _read(plain, schema, mapping_json=mapping)
    assert out.column("score").to_pylist() == [1.0, 2.0]
    with pytest.raises(SchemaMismatchError, match="name-mapping"):
        _read(plain, schema)


def test_required_column_missing_from_the_file() -> None:
    schema = Schema(NestedField(7, "must", LongType(), required=True))
    with pytest.raises(SchemaMismatchError, match=r"test\.parquet"):
        _read(FILE, schema)


def test_lists_structs_and_timestamps() -> None:
    schema = Schema(
        NestedField(1, "tokens", ListType(2, IntegerType(), element_required=False), False),
        NestedField(
            3,
            "s",
            StructType(
                NestedField(4, "a", LongType(), required=False),
                NestedField(5, "b", StringType(), required=False),  # added inside the struct
            ),
            required=False,
        ),
        NestedField(6, "ts", TimestampType(), required=False),
    )
    element = pa.field("element", pa.int32(), metadata={"PARQUET:field_id": "2"})
    struct = pa.struct([_field("a", pa.int64(), 4)])
    batch = pa.record_batch(
        [
            pa.array([[1, 2], [], None], pa.list_(element)),
            pa.array([{"a": 1}, {"a": 2}, None], struct),
            pa.array([10**9, 2 * 10**9, None], pa.timestamp("ns")),
        ],
        schema=pa.schema(
            [
                _field("tokens", pa.list_(element), 1),
                _field("s", struct, 3),
                _field("ts", pa.timestamp("ns"), 6),
            ]
        ),
    )
    out = _read(batch, schema)
    assert out.schema.field("tokens").type == pa.list_(pa.field("element", pa.int32()))
    assert out.column("tokens").to_pylist() == [[1, 2], [], None]
    assert out.column("s").to_pylist() == [{"a": 1, "b": None}, {"a": 2, "b": None}, None]
    assert out.schema.field("ts").type == pa.timestamp("us")  # v2 tables: microseconds
    assert out.column("ts").cast(pa.int64()).to_pylist() == [10**6, 2 * 10**6, None]


def test_output_schema_uses_32_bit_offsets_and_nullable_columns() -> None:
    schema = Schema(
        NestedField(1, "name", StringType(), required=True),
        NestedField(2, "tokens", ListType(3, StringType(), element_required=True), False),
    )
    arrow = output_schema(schema)
    assert arrow.field("name").type == pa.string() and arrow.field("name").nullable
    assert arrow.field("tokens").type.value_type == pa.string()


def test_projected_schema_keeps_the_order_asked_and_names_missing_columns() -> None:
    text = TABLE.model_dump_json()
    assert [f.name for f in projected_schema(text, ("count", "id")).fields] == ["count", "id"]
    assert parse_schema(text) == TABLE
    with pytest.raises(ColumnNotFoundError, match="nope"):
        projected_schema(text, ("id", "nope"))
