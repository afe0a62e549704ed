"""``Converter`` (`convert.rules`): Arrow and dict output, its options checked when made (unknown
values, output keys that collide with columns), and pickling. What each column type becomes:
test_columns.py."""

from __future__ import annotations

import pickle
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
import torch

from tests.conftest import make_table
from torch_dataloader_utils.convert import Converter
from torch_dataloader_utils.errors import (
    InvalidArgumentError,
)

# --- output formats arrow and dict ------------------------------------------------------------


def test_arrow_output_is_the_batch_and_dict_is_python_values() -> None:
    rb = make_table(np.arange(20)).to_batches()[0].slice(3, 5)
    arrow = Converter(rb.schema, output_format="arrow")(rb)
    assert isinstance(arrow, pa.RecordBatch)
    assert arrow.equals(rb)
    as_dict = Converter(rb.schema, output_format="dict")(rb)
    assert list(as_dict) == rb.schema.names
    for name in rb.schema.names:
        assert as_dict[name] == rb.column(name).to_pylist()
    assert as_dict["id"] == list(range(3, 8))


def test_every_output_format_on_the_shared_table() -> None:
    table = make_table(np.arange(30))
    rb = table.to_batches()[0].slice(3, 5)
    ids = list(range(3, 8))
    out = Converter(rb.schema)(rb)
    assert out["id"].tolist() == ids
    assert out["x"].tolist() == [i * 0.5 for i in ids]
    assert out["label"].tolist() == [i % 7 for i in ids]
    assert out["flag"].tolist() == [i % 2 == 0 for i in ids]
    assert out["name"] == [f"row-{i}" for i in ids]
    assert out["emb"].tolist() == [[i * 10 + d for d in range(4)] for i in ids]
    token_rows = [list(range(i, i + i % 5)) for i in ids]
    width = max(len(r) for r in token_rows)
    assert out["tokens"].tolist() == [r + [0] * (width - len(r)) for r in token_rows]
    assert out["tokens_lengths"].tolist() == [len(r) for r in token_rows]
    numpy_out = Converter(rb.schema, output_format="numpy")(rb)
    assert set(numpy_out) == set(out)
    for key, value in out.items():
        if isinstance(value, torch.Tensor):
            assert isinstance(numpy_out[key], np.ndarray)
            np.testing.assert_array_equal(numpy_out[key], value.numpy())
        else:
            assert numpy_out[key] == value


# --- configuration errors ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("schema", "kw", "key"),
    [
        (pa.schema([("a", pa.list_(pa.int32())), ("a_lengths", pa.int64())]), {}, "a_lengths"),
        (
            pa.schema([("a_offsets", pa.int64()), ("a", pa.list_(pa.int32()))]),
            {"list_format": "offsets"},
            "a_offsets",
        ),
        (
            pa.schema([("a", pa.list_(pa.int32())), ("a_offsets", pa.int64())]),
            {"list_format": "nested"},
            "a_offsets",
        ),
        (
            pa.schema([("x", pa.float32()), ("x_valid", pa.bool_())]),
            {"null_policy": "mask"},
            "x_valid",
        ),
        (
            pa.schema([("x_valid", pa.bool_()), ("x", pa.int8())]),
            {"null_policy": "mask"},
            "x_valid",
        ),
        (
            pa.schema([("t", pa.timestamp("us")), ("t_valid", pa.int8())]),
            {"null_policy": "mask"},
            "t_valid",
        ),
    ],
)
def test_key_collisions_are_invalid(schema: pa.Schema, kw: dict[str, Any], key: str) -> None:
    for output_format in ["torch", "numpy"]:
        if kw.get("list_format") == "nested" and output_format == "numpy":
            continue
        with pytest.raises(InvalidArgumentError, match=key):
            Converter(schema, output_format=output_format, **kw)


def test_no_collision_when_no_key_is_added() -> None:
    # Without the mask policy no ``_valid`` key is added, so the column name is free.
    schema = pa.schema([("x", pa.float32()), ("x_valid", pa.bool_())])
    rb = pa.RecordBatch.from_pydict({"x": [1.0], "x_valid": [False]}, schema=schema)
    out = Converter(schema, null_policy="fill")(rb)
    assert out["x_valid"].tolist() == [False]


def test_key_collision_of_a_dictionary_column_is_invalid() -> None:
    schema = pa.schema([("d", pa.dictionary(pa.int32(), pa.int64())), ("d_valid", pa.int64())])
    with pytest.raises(InvalidArgumentError, match="d_valid"):
        Converter(schema, null_policy="mask")


@pytest.mark.parametrize(
    "kw",
    [
        {"output_format": "pandas"},
        {"output_format": "Torch"},
        {"list_format": "ragged"},
        {"null_policy": "ignore"},
        {"null_policy": None},
        {"list_format": "nested", "output_format": "numpy"},
    ],
)
def test_bad_options_are_invalid_arguments(kw: dict[str, Any]) -> None:
    with pytest.raises(InvalidArgumentError) as info:
        Converter(pa.schema([("a", pa.int64())]), **kw)
    assert isinstance(info.value, ValueError)


# --- pickling ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "kw",
    [
        {},
        {"output_format": "numpy", "list_format": "offsets"},
        {"list_format": "nested", "null_policy": "mask"},
        {"null_policy": "fill", "pad_value": -5},
        {"output_format": "dict"},
    ],
)
def test_converter_pickles_and_still_converts(kw: dict[str, Any]) -> None:
    table = make_table(np.arange(40))
    rb = table.to_batches()[0].slice(3, 5)
    converter = Converter(table.schema, **kw)
    copy = pickle.loads(pickle.dumps(converter))
    assert (copy.output_format, copy.list_format, copy.null_policy, copy.pad_value) == (
        converter.output_format,
        converter.list_format,
        converter.null_policy,
        converter.pad_value,
    )
    assert copy.schema.equals(converter.schema)
    want, got = converter(rb), copy(rb)
    assert list(got) == list(want)
    for key in want:
        a, b = want[key], got[key]
        if isinstance(a, torch.Tensor) and a.is_nested:
            assert [x.tolist() for x in a.unbind()] == [x.tolist() for x in b.unbind()]
        elif isinstance(a, torch.Tensor | np.ndarray):
            assert a.dtype == b.dtype
            assert a.tolist() == b.tolist()
        else:
            assert a == b
