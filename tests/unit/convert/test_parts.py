"""A shuffle block left in parts (a table over the batches read) converts exactly as the same
block joined into one record batch: every output format, null policy and list format, rows from
one part or all, packed for a worker's message or not."""

from __future__ import annotations

import itertools
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
import torch

from tests.conftest import make_table
from tests.unit.transport.test_wire import assert_same_batch
from torch_dataloader_utils.convert import Converter, GatherParts, as_numpy, as_tensor
from torch_dataloader_utils.convert.arrow_values import take
from torch_dataloader_utils.convert.lists import ListParts
from torch_dataloader_utils.transport import pack

N = 157


def block() -> pa.RecordBatch:
    """Every kind of column the converter treats differently, some with nulls."""
    table = make_table(np.arange(N), emb_dim=3)  # id, x, label, flag, name, emb, tokens
    maybe = [None if i % 5 == 0 else i * 1.5 for i in range(N)]
    table = table.append_column("maybe", pa.array(maybe, pa.float64()))
    table = table.append_column("half", pa.array(np.arange(N) / 7, pa.float16()))
    table = table.append_column(
        "when", pa.array(np.arange(N) * 1000, pa.int64()).cast(pa.timestamp("ms"))
    )
    words = pa.array([f"w{i % 4}" for i in range(N)]).dictionary_encode()
    table = table.append_column("word", words)
    vecs = [None if i % 9 == 0 else [i, -i] for i in range(N)]
    table = table.append_column("vec", pa.array(vecs, pa.list_(pa.int16(), 2)))
    return table.combine_chunks().to_batches()[0]


def in_parts(rb: pa.RecordBatch, cuts: list[int]) -> pa.Table:
    """``rb`` as a table over slices cut at ``cuts`` (slices: parts with an offset)."""
    bounds = [0, *cuts, rb.num_rows]
    return pa.Table.from_batches([rb.slice(a, b - a) for a, b in itertools.pairwise(bounds)])


CUTS = {"two": [70], "uneven": [1, 2, 100], "empty part": [40, 40, 120]}
ROWS = {
    "shuffled": np.random.default_rng(3).permutation(N),
    "some": np.random.default_rng(4).permutation(N)[:33],
    "one part": np.arange(60)[::-1].copy(),
    "one row": np.array([N - 1]),
    "none": np.arange(0),
}


def same(got: dict[str, Any], want: dict[str, Any]) -> None:
    assert list(got) == list(want)
    for key, value in want.items():
        if isinstance(value, np.ndarray):
            np.testing.assert_array_equal(got[key], value, err_msg=key)
        elif isinstance(value, torch.Tensor):
            torch.testing.assert_close(got[key], value, rtol=0, atol=0, equal_nan=True, msg=key)
        else:
            assert got[key] == value, key


@pytest.mark.parametrize("cuts", CUTS)
@pytest.mark.parametrize("rows", ROWS)
@pytest.mark.parametrize("policy", ["fill", "mask"])
@pytest.mark.parametrize("list_format", ["padded", "offsets"])
def test_parts_convert_as_the_joined_block(
    cuts: str, rows: str, policy: str, list_format: str
) -> None:
    rb = block()
    table = in_parts(rb, CUTS[cuts])
    chosen = ROWS[rows]
    for output_format in ["torch", "numpy"]:
        converter = Converter(
            rb.schema, output_format=output_format, null_policy=policy, list_format=list_format
        )
        same(converter(table, chosen), converter(rb, chosen))
    for output_format in ["arrow", "dict"]:
        converter = Converter(rb.schema, output_format=output_format, null_policy=policy)
        got, want = converter(table, chosen), converter(rb, chosen)
        assert got == want if output_format == "dict" else got.equals(want)


@pytest.mark.parametrize("cuts", CUTS)
def test_null_free_numeric_columns_are_gathered_from_the_parts_and_packed_alike(
    cuts: str,
) -> None:
    rb = block()
    table = in_parts(rb, CUTS[cuts])
    converter = Converter(rb.schema, null_policy="fill")
    rows = ROWS["shuffled"]
    fields = converter.fields(table, rows)
    gathered = {f.key for f in fields if isinstance(f.data, GatherParts)}
    # Numeric and fixed-size list columns without nulls; "maybe" and "vec" hold nulls.
    assert gathered == {"id", "x", "label", "half", "emb"}
    want = {f.key: as_tensor(f) for f in converter.fields(rb, rows)}
    same({f.key: as_tensor(f) for f in fields}, want)
    for f in fields:
        if isinstance(f.data, GatherParts):
            np.testing.assert_array_equal(as_numpy(f), want[f.key].numpy())
    batches = pack([converter.fields(table, r) for r in np.array_split(rows, 3)]).unpack()
    for got, part in zip(batches, np.array_split(rows, 3), strict=True):
        assert_same_batch(got, converter(rb, part))


@pytest.mark.parametrize("cuts", CUTS)
@pytest.mark.parametrize("list_format", ["padded", "offsets", "nested"])
def test_null_free_list_columns_are_gathered_from_the_parts_never_joined(
    cuts: str, list_format: str
) -> None:
    """A numeric list column without nulls is gathered from each part's values (no join of
    the block's lists: a whole block copied once more per block); one whose values hold a
    null is joined and filled as before. Either way the batch is the joined block's."""
    rb = block()
    holes = pa.array([[i, None] if i == 5 else [i] for i in range(N)], pa.list_(pa.int32()))
    rb = rb.append_column("holes", holes)
    # Each part with its own buffers (slices of one batch share them).
    bounds = [0, *CUTS[cuts], N]
    fresh = [
        rb.slice(a, b - a).take(pa.array(np.arange(b - a))) for a, b in itertools.pairwise(bounds)
    ]
    table = pa.Table.from_batches(fresh)
    rows = ROWS["shuffled"]
    converter = Converter(rb.schema, null_policy="fill", list_format=list_format)
    fields = converter.fields(table, rows)
    assert {f.key for f in fields if isinstance(f.data, ListParts)} == {"tokens"}
    blocks = converter._parts.get(table)
    assert blocks is not None and "tokens" not in blocks._joined and "holes" in blocks._joined
    want = converter(rb, rows)
    got = converter(table, rows)
    if list_format == "nested":  # (nested tensors: compared by their rows)
        for key in ("tokens", "holes"):
            assert [t.tolist() for t in got[key].unbind()] == [
                t.tolist() for t in want[key].unbind()
            ]
            got.pop(key), want.pop(key)
    same(got, want)
    if list_format != "nested":
        parts = np.array_split(rows, 3)
        batches = pack([converter.fields(table, r) for r in parts]).unpack()
        for batch, part in zip(batches, parts, strict=True):
            assert_same_batch(batch, converter(rb, part))


def test_a_table_is_taken_from_its_chunks() -> None:
    rb = block()
    table = in_parts(rb, CUTS["uneven"])
    for rows in ROWS.values():
        got = take(table, rows)
        assert isinstance(got, pa.RecordBatch)
        assert got.equals(rb.take(pa.array(rows, pa.int64())))
        column = take(table.column("tokens"), rows)
        assert column.equals(rb.column("tokens").take(pa.array(rows, pa.int64())))
