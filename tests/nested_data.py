"""Parquet files with fixed-size lists and maps, at depth, for the one-plan-on-every-path tests.

pyarrow's pickling and Arrow IPC rename these types' children, so these are the files whose
plans once differed by path. Every value is a function of the row's ``id`` (`check_batch`
checks a converted batch against it), and ids run ``0..rows-1`` across the files in order.
Test modules import these from here, never from each other.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq


def nested_types(*, nullable_child: bool = True) -> dict[str, pa.DataType]:
    """The columns beside ``id``: a fixed-size list (its child not nullable unless
    ``nullable_child``), a map, both inside a struct, and a map of lists of fixed-size lists
    inside a list."""
    fsl = pa.list_(pa.field("element", pa.int64(), nullable_child), 2)
    mp = pa.map_(pa.string(), pa.int64())
    return {
        "fsl": fsl,
        "m": mp,
        "s": pa.struct([pa.field("f", fsl), pa.field("m", mp)]),
        "lm": pa.list_(pa.map_(pa.string(), pa.list_(fsl))),
    }


def nested_table(ids: np.ndarray, *, nullable_child: bool = True) -> pa.Table:
    """Rows of ``ids`` with the `nested_types` columns."""
    types = nested_types(nullable_child=nullable_child)
    ids = [int(i) for i in ids]
    return pa.table(
        {
            "id": pa.array(ids, pa.int64()),
            "fsl": pa.array([[i, -i] for i in ids], types["fsl"]),
            "m": pa.array([[("id", i)] for i in ids], types["m"]),
            "s": pa.array([{"f": [i, 1], "m": [("k", i)]} for i in ids], types["s"]),
            "lm": pa.array([[[("k", [[i, 2]])]] for i in ids], types["lm"]),
        }
    )


def write_nested(
    root: Path, sizes: tuple[int, ...], *, row_group_size: int = 16, nullable_child: bool = True
) -> int:
    """Parquet files ``part-NN.parquet`` of ``sizes`` rows under ``root``; the rows in all."""
    root.mkdir(parents=True, exist_ok=True)
    start = 0
    for i, size in enumerate(sizes):
        table = nested_table(np.arange(start, start + size), nullable_child=nullable_child)
        pq.write_table(table, root / f"part-{i:02d}.parquet", row_group_size=row_group_size)
        start += size
    return start


def check_batch(batch: dict[str, Any]) -> list[int]:
    """The ids of a converted batch (torch output), after checking every column against them.

    Raises:
        AssertionError: a value is not its row's.
    """
    ids = [int(i) for i in batch["id"].tolist()]
    assert batch["fsl"].tolist() == [[i, -i] for i in ids]
    assert batch["m"] == [[("id", i)] for i in ids]
    assert batch["s"] == [{"f": [i, 1], "m": [("k", i)]} for i in ids]
    assert batch["lm"] == [[[("k", [[i, 2]])]] for i in ids]
    return ids
