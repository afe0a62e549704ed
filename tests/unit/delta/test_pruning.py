"""Files pruned by partition values and exact statistics, never a file that may match."""

from __future__ import annotations

from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from torch_dataloader_utils.delta.pruning import kept_files

SCHEMA = pa.schema([("id", pa.int64()), ("p", pa.string()), ("x", pa.float64())])
ROWS: list[dict[str, Any]] = [
    {
        "num_records": 10,
        "null_count.c-id": 0,
        "min.c-id": 0,
        "max.c-id": 9,
        "partition.p": "a",
        "min.x": 0.0,
        "max.x": 1.0,
        "null_count.x": 0,
    },
    {"num_records": 10, "null_count.c-id": 0, "min.c-id": 10, "max.c-id": 19, "partition.p": "b"},
    {"num_records": 10, "null_count.c-id": 2, "min.c-id": 20, "max.c-id": 29, "partition.p": None},
    {
        "num_records": 10,
        "null_count.c-id": 10,
        "min.c-id": None,
        "max.c-id": None,
        "partition.p": "a",
    },
]


def _kept(expr: pc.Expression | None) -> list[bool]:
    return kept_files(ROWS, expr, SCHEMA, ("p",), {"id": "c-id"})


def test_files_are_pruned_by_partition_values_and_statistics() -> None:
    assert _kept(None) == [True] * 4
    assert _kept(pc.field("p") == "b") == [False, True, False, False]
    assert _kept(pc.field("id") >= 15) == [False, True, True, False]  # (3: nulls, no bounds)
    assert _kept(pc.field("id").is_null()) == [False, False, True, True]
    # File 3: null < 5 is null, "a" == "b" false: no row passes.
    assert _kept((pc.field("id") < 5) | (pc.field("p") == "b")) == [True, True, True, False]
    assert _kept(pc.field("p").is_null() & (pc.field("id") > 100)) == [False, False, True, False]
    # Float statistics are not trusted (NaN is outside min and max).
    assert _kept(pc.field("x") > 5.0) == [True] * 4
