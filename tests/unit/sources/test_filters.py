"""``filter_columns``: validation of ``filters`` and the columns it reads."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds
import pyarrow.parquet as pq
import pytest

from torch_dataloader_utils.errors import (
    ColumnNotFoundError,
    FilterTypeError,
    TorchDataloaderUtilsError,
)
from torch_dataloader_utils.sources.filters import filter_columns

SCHEMA = pa.schema(
    [
        ("id", pa.int64()),
        ("x", pa.float32()),
        ("name", pa.string()),
        ("flag", pa.bool_()),
        ("year", pa.int64()),
        ("tokens", pa.list_(pa.int32())),
    ]
)

CASES: list[tuple[pc.Expression, set[str]]] = [
    (pc.field("id") > 3, {"id"}),
    ((pc.field("id") > 3) & (pc.field("name") == "a"), {"id", "name"}),
    ((pc.field("x") < 0.5) | ~pc.field("flag"), {"x", "flag"}),
    (pc.field("id") + pc.field("year") > 2020, {"id", "year"}),
    (pc.field("name").isin(["a", "b"]), {"name"}),
    (pc.field("x").is_null(), {"x"}),
    (pc.field("flag"), {"flag"}),
    (pc.scalar(True), set()),
    (pc.list_value_length(pc.field("tokens")) > 2, {"tokens"}),
    (pq.filters_to_expression([("year", "=", 2024), ("id", "<", 5)]), {"year", "id"}),
    (
        (pc.field("id") > 0) & (pc.field("id") < 10) & (pc.field("year") == 2024),
        {"id", "year"},
    ),
]


def test_returns_exactly_the_referenced_columns() -> None:
    for expr, expected in CASES:
        found = filter_columns(expr, SCHEMA)
        assert set(found) == expected, expr
        assert len(found) == len(set(found)), expr
        # In schema order, so the result is deterministic.
        assert list(found) == [n for n in SCHEMA.names if n in expected], expr


def test_referenced_columns_are_enough_to_evaluate_the_filter() -> None:
    # Independent check: the filter evaluates on a table holding only the returned columns, and
    # gives the same rows as on the full table.
    table = pa.table(
        {
            "id": [1, 4, 7, None],
            "x": pa.array([0.1, 0.9, None, 0.2], pa.float32()),
            "name": ["a", "b", "c", "a"],
            "flag": [True, False, True, False],
            "year": [2024, 2023, 2024, 2024],
            "tokens": pa.array([[1], [1, 2, 3], [], [4, 5, 6, 7]], pa.list_(pa.int32())),
        },
        schema=SCHEMA,
    )
    for expr, _ in CASES:
        found = filter_columns(expr, SCHEMA)
        narrow = ds.dataset(table.select(list(found))) if found else None
        if narrow is None:
            continue
        assert narrow.to_table(filter=expr).equals(
            ds.dataset(table).to_table(filter=expr, columns=list(found))
        )


def test_none_reads_no_columns() -> None:
    assert filter_columns(None, SCHEMA) == ()


def test_partition_columns_in_the_schema_are_found() -> None:
    schema = SCHEMA.append(pa.field("part", pa.string()))
    assert filter_columns(pc.field("part") == "x", schema) == ("part",)


def test_a_non_expression_is_a_filter_type_error() -> None:
    for bad in ["id > 3", [("id", ">", 3)], 3, {"id": 3}, True, pc.greater]:
        with pytest.raises(FilterTypeError) as info:
            filter_columns(bad, SCHEMA)
        assert isinstance(info.value, TypeError)
        assert isinstance(info.value, TorchDataloaderUtilsError)
        # The message points to the type the user passed.
        assert type(bad).__name__ in str(info.value)


def test_an_unknown_column_is_column_not_found() -> None:
    for expr in [
        pc.field("nope") > 1,
        (pc.field("id") > 1) & (pc.field("nope") == 2),
        pc.field("ID") > 1,  # names are case-sensitive
    ]:
        with pytest.raises(ColumnNotFoundError) as info:
            filter_columns(expr, SCHEMA)
        assert isinstance(info.value, ValueError)
        assert isinstance(info.value, TorchDataloaderUtilsError)
        assert info.value.__cause__ is not None


def test_a_filter_that_does_not_type_check_is_rejected() -> None:
    with pytest.raises(ColumnNotFoundError):
        filter_columns(pc.field("name") > 3, SCHEMA)
