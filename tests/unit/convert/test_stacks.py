"""Small shuffled batches take their numeric columns from a block's stacks (one gather for all
columns of a type), and convert exactly as column by column: every output format and null
policy, columns with nulls in the block, blocks that alternate."""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa
import pytest
import torch

from tests.conftest import make_table
from tests.unit.transport.test_wire import assert_same_batch
from torch_dataloader_utils.convert import Converter, as_numpy, as_tensor
from torch_dataloader_utils.convert.stacks import STACK_ROWS
from torch_dataloader_utils.errors import NullValueError

N = 300


def block(ids: np.ndarray, *, nulls: bool) -> pa.RecordBatch:
    """id and label (int64), x (float32), more numeric columns of both types, and the other
    kinds of column; ``nulls``: "late" (int64) has nulls, "y" (float32) none."""
    table = make_table(ids, emb_dim=3)
    table = table.append_column("y", pa.array((ids * 0.25).astype(np.float32)))
    late = [None if nulls and i % 7 == 0 else int(i) * 3 for i in ids]
    table = table.append_column("late", pa.array(late, pa.int64()))
    table = table.append_column("small", pa.array((ids % 100).astype(np.int8)))
    return table.combine_chunks().to_batches()[0]


def column_by_column(converter: Converter, rb: pa.RecordBatch, rows: np.ndarray) -> Any:
    fields = converter.fields(rb, rows)
    if converter.output_format == "numpy":
        return {f.key: as_numpy(f) for f in fields}
    return converter.finish_torch({f.key: as_tensor(f) for f in fields})


def as_tensors(batch: dict[str, Any]) -> dict[str, Any]:
    return {
        k: torch.from_numpy(np.array(v)) if isinstance(v, np.ndarray) else v
        for k, v in batch.items()
    }


@pytest.mark.parametrize("output_format", ["torch", "numpy"])
@pytest.mark.parametrize("null_policy", ["error", "fill", "mask"])
@pytest.mark.parametrize("nulls", [False, True], ids=["null-free", "nulls-in-block"])
def test_small_batches_convert_as_column_by_column(
    output_format: str, null_policy: str, nulls: bool
) -> None:
    rng = np.random.default_rng(3)
    blocks = [block(np.arange(N) + k * N, nulls=nulls) for k in range(2)]
    converter = Converter(blocks[0].schema, output_format=output_format, null_policy=null_policy)  # type: ignore[arg-type]
    reference = Converter(blocks[0].schema, output_format=output_format, null_policy=null_policy)  # type: ignore[arg-type]
    for size in (0, 1, 8, STACK_ROWS - 1, STACK_ROWS):
        for rb in (*blocks, blocks[0]):  # blocks alternate: each block's own stacks
            rows = rng.permutation(N)[:size]
            if null_policy == "error" and nulls:  # the block's nulls: an error either way
                for convert in (converter, lambda b, r: column_by_column(reference, b, r)):
                    with pytest.raises(NullValueError, match="'late'"):
                        convert(rb, rows)
                continue
            got = converter(rb, rows)
            want = column_by_column(reference, rb, rows)
            assert list(got) == list(want)  # the columns' order
            assert_same_batch(as_tensors(got), as_tensors(want))
            ids = np.asarray(got["id"])
            assert ids.tolist() == rb.column("id").to_numpy()[rows].tolist()
    # (masks come from each column's rule: nothing is stacked under "mask")
    assert (converter._stacks.get(blocks[0]) is not None) == (null_policy != "mask")


def test_stacked_columns_are_contiguous_and_independent() -> None:
    rb = block(np.arange(N), nulls=False)
    converter = Converter(rb.schema)
    batch = converter(rb, np.arange(8)[::-1].copy())
    assert all(batch[k].is_contiguous() for k in ("id", "label", "late", "x", "y"))
    batch["x"][:] = -1  # an edit of one column changes no other
    assert batch["y"].tolist() == [i * 0.25 for i in range(7, -1, -1)]
    assert batch["id"].tolist() == list(range(7, -1, -1))


@pytest.mark.parametrize("output_format", ["torch", "numpy"])
def test_an_all_numeric_batch_keeps_the_columns_order(output_format: str) -> None:
    ids = np.arange(N)
    rb = pa.RecordBatch.from_pydict(
        {
            "a": ids,
            "b": (ids * 0.5).astype(np.float32),
            "c": ids * 2,
            "d": (ids % 3).astype(np.float32),
        }
    )
    converter = Converter(rb.schema, output_format=output_format)  # type: ignore[arg-type]
    rows = np.array([5, 3, 200])
    batch = converter(rb, rows)
    assert converter._stacks.get(rb) is not None  # every column came from the stacks
    assert list(batch) == ["a", "b", "c", "d"]
    assert np.asarray(batch["a"]).tolist() == [5, 3, 200]
    assert np.asarray(batch["c"]).tolist() == [10, 6, 400]
    assert np.asarray(batch["d"]).tolist() == [2.0, 0.0, 2.0]
