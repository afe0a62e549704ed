"""What each column becomes, by its type (`convert.columns`): every mapping of the package's table,
checked value by value against Arrow through ``Converter``, with nulls refused, filled or masked,
and list columns against a plain Python reference."""

from __future__ import annotations

import itertools
import math
import uuid
from decimal import Decimal
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest
import torch

from tests.conftest import make_table
from torch_dataloader_utils.convert import Converter, as_numpy
from torch_dataloader_utils.errors import (
    InvalidArgumentError,
    NullValueError,
)

RNG_SEED = 7


NUMERIC: list[tuple[pa.DataType, torch.dtype, Any]] = [
    (pa.int8(), torch.int8, np.int8),
    (pa.int16(), torch.int16, np.int16),
    (pa.int32(), torch.int32, np.int32),
    (pa.int64(), torch.int64, np.int64),
    (pa.uint8(), torch.uint8, np.uint8),
    (pa.uint16(), torch.uint16, np.uint16),
    (pa.uint32(), torch.uint32, np.uint32),
    (pa.uint64(), torch.uint64, np.uint64),
    (pa.float16(), torch.float16, np.float16),
    (pa.float32(), torch.float32, np.float32),
    (pa.float64(), torch.float64, np.float64),
]


def numeric_array(t: pa.DataType, np_dtype: Any, n: int = 12) -> pa.Array:
    """Random values spanning the type's range (so a narrowing conversion would show)."""
    rng = np.random.default_rng(RNG_SEED)
    if np.issubdtype(np_dtype, np.integer):
        info = np.iinfo(np_dtype)
        values = rng.integers(info.min, info.max, size=n, dtype=np_dtype, endpoint=True)
        values[:2] = [info.min, info.max]
    else:
        values = (rng.standard_normal(n) * 1000).astype(np_dtype)
    return pa.array(values, type=t)


def batch(**columns: pa.Array) -> pa.RecordBatch:
    return pa.RecordBatch.from_arrays(list(columns.values()), names=list(columns))


def as_np(value: torch.Tensor) -> np.ndarray:
    """A tensor's values as numpy (uint16/32/64 tensors have no ``.numpy()`` everywhere)."""
    if value.dtype in (torch.uint16, torch.uint32, torch.uint64):
        return (
            value.contiguous()
            .view(torch.int8)
            .numpy()
            .view(
                {torch.uint16: np.uint16, torch.uint32: np.uint32, torch.uint64: np.uint64}[
                    value.dtype
                ]
            )
            .reshape(value.shape)
        )
    return value.numpy()


def convert(rb: pa.RecordBatch, **kw: Any) -> dict[str, Any]:
    out: dict[str, Any] = Converter(rb.schema, **kw)(rb)
    return out


# --- numeric, bool, temporal ------------------------------------------------------------------


@pytest.mark.parametrize(("arrow_type", "torch_dtype", "np_dtype"), NUMERIC, ids=str)
def test_numeric_dtype_and_values_are_preserved(arrow_type, torch_dtype, np_dtype) -> None:
    array = numeric_array(arrow_type, np_dtype)
    expected = np.asarray(array.to_pylist(), dtype=np_dtype)
    for rb, want in [(batch(c=array), expected), (batch(c=array).slice(3, 5), expected[3:8])]:
        t = convert(rb)["c"]
        assert isinstance(t, torch.Tensor)
        assert t.dtype == torch_dtype
        assert t.shape == (len(want),)
        np.testing.assert_array_equal(as_np(t), want)
        a = convert(rb, output_format="numpy")["c"]
        assert isinstance(a, np.ndarray)
        assert a.dtype == np.dtype(np_dtype)
        np.testing.assert_array_equal(a, want)


def test_bool_becomes_a_bool_tensor() -> None:
    values = [True, False, False, True, True, False, True, False, False, True]
    rb = batch(b=pa.array(values))
    for sub, want in [(rb, values), (rb.slice(3, 5), values[3:8])]:
        t = convert(sub)["b"]
        assert t.dtype == torch.bool
        assert t.tolist() == want
        a = convert(sub, output_format="numpy")["b"]
        assert a.dtype == np.bool_
        assert a.tolist() == want


TEMPORAL: list[tuple[pa.DataType, torch.dtype]] = [
    (pa.timestamp("s"), torch.int64),
    (pa.timestamp("ms"), torch.int64),
    (pa.timestamp("us"), torch.int64),
    (pa.timestamp("ns", tz="Europe/Paris"), torch.int64),
    (pa.date32(), torch.int32),
    (pa.date64(), torch.int64),
    (pa.time32("s"), torch.int32),
    (pa.time32("ms"), torch.int32),
    (pa.time64("us"), torch.int64),
    (pa.time64("ns"), torch.int64),
    (pa.duration("s"), torch.int64),
    (pa.duration("ns"), torch.int64),
]


@pytest.mark.parametrize(("arrow_type", "torch_dtype"), TEMPORAL, ids=str)
def test_temporal_types_become_ints_of_the_stored_unit(arrow_type, torch_dtype) -> None:
    stored = [0, 1, 86_400, 12_345, 7, 3_600, 59, 86_399, 2, 40_000]
    if arrow_type == pa.date64():
        stored = [d * 86_400_000 for d in stored]  # date64 is milliseconds of whole days
    int_type = pa.int32() if torch_dtype == torch.int32 else pa.int64()
    array = pa.array(stored, int_type).cast(arrow_type)
    rb = batch(t=array)
    for sub, want in [(rb, stored), (rb.slice(3, 5), stored[3:8])]:
        t = convert(sub)["t"]
        assert t.dtype == torch_dtype
        assert t.tolist() == want
        a = convert(sub, output_format="numpy")["t"]
        assert a.dtype == (np.int32 if torch_dtype == torch.int32 else np.int64)
        assert a.tolist() == want


# --- lists ------------------------------------------------------------------------------------


def test_fixed_size_list_becomes_2d() -> None:
    table = make_table(np.arange(10), emb_dim=3)
    rb = table.to_batches()[0]
    rows = table.column("emb").to_pylist()
    for sub, want in [(rb, rows), (rb.slice(3, 5), rows[3:8])]:
        t = convert(sub.select(["emb"]))["emb"]
        assert t.dtype == torch.float32
        assert t.shape == (len(want), 3)
        assert t.tolist() == want
        a = convert(sub.select(["emb"]), output_format="numpy")["emb"]
        assert a.shape == (len(want), 3)
        np.testing.assert_array_equal(a, np.array(want, dtype=np.float32))


LISTS = [[1, 2], [], [3], [4, 5, 6, 7], [], [8], [9, 10, 11], [12, 13], [], [14]]


def list_batch(*, large: bool = False) -> pa.RecordBatch:
    list_type = pa.large_list(pa.int32()) if large else pa.list_(pa.int32())
    return batch(tokens=pa.array(LISTS, list_type), id=pa.array(range(len(LISTS)), pa.int64()))


def padded(rows: list[list[Any]], pad: Any) -> list[list[Any]]:
    width = max((len(r) for r in rows), default=0)
    return [r + [pad] * (width - len(r)) for r in rows]


@pytest.mark.parametrize("large", [False, True])
def test_list_padded_with_lengths(large: bool) -> None:
    rb = list_batch(large=large)
    for sub, rows in [(rb, LISTS), (rb.slice(3, 5), LISTS[3:8]), (rb.slice(1, 1), LISTS[1:2])]:
        for output_format in ["torch", "numpy"]:
            out = convert(sub, output_format=output_format, pad_value=-1)
            assert list(out) == ["tokens", "tokens_lengths", "id"]
            values = out["tokens"]
            assert values.tolist() == padded(rows, -1)
            assert str(values.dtype).endswith("int32")
            assert values.shape == (len(rows), max(len(r) for r in rows))
            assert out["tokens_lengths"].tolist() == [len(r) for r in rows]


def test_float_list_padded_with_nan() -> None:
    rows = [[0.5], [], [1.5, 2.5]]
    rb = batch(v=pa.array(rows, pa.list_(pa.float64())))
    out = convert(rb, pad_value=float("nan"))
    assert out["v"].dtype == torch.float64
    got = out["v"].tolist()
    assert got[0][0] == 0.5 and math.isnan(got[0][1])
    assert all(math.isnan(x) for x in got[1])
    assert got[2] == [1.5, 2.5]
    assert out["v_lengths"].tolist() == [1, 0, 2]


@pytest.mark.parametrize("large", [False, True])
def test_list_offsets_are_rebased_for_sliced_batches(large: bool) -> None:
    rb = list_batch(large=large)
    for sub, rows in [(rb, LISTS), (rb.slice(3, 5), LISTS[3:8]), (rb.slice(9, 1), LISTS[9:])]:
        for output_format in ["torch", "numpy"]:
            out = convert(sub, output_format=output_format, list_format="offsets")
            assert list(out) == ["tokens", "tokens_offsets", "id"]
            assert out["tokens"].tolist() == [v for r in rows for v in r]
            expected_offsets = np.concatenate([[0], np.cumsum([len(r) for r in rows])])
            assert out["tokens_offsets"].tolist() == expected_offsets.tolist()
            assert out["id"].tolist() == sub.column("id").to_pylist()


def test_list_nested_is_a_jagged_nested_tensor() -> None:
    rb = list_batch()
    for sub, rows in [(rb, LISTS), (rb.slice(3, 5), LISTS[3:8])]:
        out = convert(sub, list_format="nested")
        assert set(out) == {"tokens", "id"}  # the offsets live inside the nested tensor
        nested = out["tokens"]
        assert nested.is_nested
        assert nested.dtype == torch.int32
        assert nested.size(0) == len(rows)
        assert [t.tolist() for t in nested.unbind()] == rows
        assert nested.offsets().tolist() == np.cumsum([0] + [len(r) for r in rows]).tolist()


def test_zero_row_batch() -> None:
    rb = make_table(np.arange(10)).to_batches()[0].slice(0, 0)
    out = convert(rb)
    assert out["id"].shape == (0,)
    assert out["emb"].shape == (0, 4)
    assert out["tokens"].shape[0] == 0
    assert out["tokens_lengths"].shape == (0,)
    assert out["name"] == []
    assert convert(rb, list_format="offsets")["tokens_offsets"].tolist() == [0]


# --- strings and other types ------------------------------------------------------------------


def test_strings_and_binary_become_python_lists() -> None:
    names = ["a", "", "héllo", None, "x" * 100, "b", "c", "d"]
    blobs = [b"\x00\x01", b"", None, b"z", b"y", b"x", b"w", b"v"]
    rb = batch(
        s=pa.array(names, pa.string()),
        ls=pa.array(names, pa.large_string()),
        b=pa.array(blobs, pa.binary()),
        dec=pa.array([Decimal(f"{k}.25") for k in range(8)], pa.decimal128(10, 2)),
    )
    for sub, sl in [(rb, slice(None)), (rb.slice(3, 5), slice(3, 8))]:
        for output_format in ["torch", "numpy"]:
            out = convert(sub, output_format=output_format)
            assert out["s"] == names[sl]
            assert out["ls"] == names[sl]
            assert out["b"] == blobs[sl]
            assert out["dec"] == sub.column("dec").to_pylist()


def test_dictionary_columns_are_decoded() -> None:
    rb = batch(
        d=pa.array([3, 1, 3, 2]).dictionary_encode(),
        s=pa.array(["x", "y", "x", "z"]).dictionary_encode(),
    )
    out = convert(rb)
    assert out["d"].dtype == torch.int64
    assert out["d"].tolist() == [3, 1, 3, 2]
    assert out["s"] == ["x", "y", "x", "z"]


# --- nulls ------------------------------------------------------------------------------------


NULLABLE = {
    "i": pa.array([1, None, 3, 4, None, 6, 7, 8], pa.int32()),
    "u": pa.array([None, 2, 3, 4, 5, 6, 7, None], pa.uint64()),
    "f": pa.array([1.5, 2.5, None, 4.5, 5.5, None, 7.5, 8.5], pa.float32()),
    "b": pa.array([True, None, True, False, None, True, True, None], pa.bool_()),
    "t": pa.array([1, 2, None, 4, 5, 6, None, 8], pa.int64()).cast(pa.timestamp("ms")),
}


FILL = {"i": 0, "u": 0, "f": float("nan"), "b": False, "t": 0}


DTYPE = {"i": "int32", "u": "uint64", "f": "float32", "b": "bool", "t": "int64"}


def same(got: list[Any], want: list[Any]) -> bool:
    """Equality with NaN equal to NaN."""
    return len(got) == len(want) and all(
        (isinstance(g, float) and isinstance(w, float) and math.isnan(g) and math.isnan(w))
        or g == w
        for g, w in zip(got, want, strict=True)
    )


@pytest.mark.parametrize("name", sorted(NULLABLE))
def test_nulls_raise_by_default_naming_the_column(name: str) -> None:
    rb = batch(ok=pa.array(range(8)), **{f"col_{name}": NULLABLE[name]})
    for output_format in ["torch", "numpy"]:
        with pytest.raises(NullValueError) as info:
            convert(rb, output_format=output_format)
        assert f"col_{name}" in str(info.value)
        assert isinstance(info.value, ValueError)
    # Row 3 of every column is valid: a batch without nulls converts.
    assert convert(rb.slice(3, 1))[f"col_{name}"].tolist() == [
        NULLABLE[name].cast(pa.int64() if name == "t" else NULLABLE[name].type)[3].as_py()
    ]


@pytest.mark.parametrize("name", sorted(NULLABLE))
@pytest.mark.parametrize("policy", ["fill", "mask"])
def test_fill_and_mask_keep_the_dtype(name: str, policy: str) -> None:
    array = NULLABLE[name]
    rb = batch(c=array)
    for sub, lo, hi in [(rb, 0, 8), (rb.slice(3, 5), 3, 8)]:
        source = array.slice(lo, hi - lo)
        raw = source.to_pylist() if name != "t" else source.cast(pa.int64()).to_pylist()
        want = [FILL[name] if v is None else v for v in raw]
        for output_format in ["torch", "numpy"]:
            out = convert(sub, output_format=output_format, null_policy=policy)
            values = out["c"]
            assert same(values.tolist(), want), (values, want)
            assert str(values.dtype).split(".")[-1] == DTYPE[name]
            if policy == "mask":
                assert list(out) == ["c", "c_valid"]
                assert out["c_valid"].tolist() == [v is not None for v in raw]
                assert str(out["c_valid"].dtype).endswith("bool")
            else:
                assert list(out) == ["c"]


def test_mask_key_is_in_every_batch_nulls_or_not() -> None:
    # The keys of a batch must not depend on its data: a batch without nulls, and an empty one,
    # carry ``_valid`` too.
    rb = batch(c=pa.array([1.0, 2.0, 3.0, None]), b=pa.array([True, False, None, True]))
    converter = Converter(rb.schema, null_policy="mask")
    clean = converter(rb.slice(0, 2))
    assert list(clean) == ["c", "c_valid", "b", "b_valid"]
    assert clean["c"].tolist() == [1.0, 2.0]
    assert clean["c_valid"].tolist() == [True, True]
    assert clean["b_valid"].tolist() == [True, True]
    assert list(converter(rb.slice(0, 0))) == ["c", "c_valid", "b", "b_valid"]
    assert list(converter(rb)) == ["c", "c_valid", "b", "b_valid"]


@pytest.mark.parametrize("list_format", ["padded", "offsets", "nested"])
def test_lists_with_nulls_raise_naming_the_column_by_default(list_format: str) -> None:
    for column in [
        pa.array([[1], None, [2, 3]], pa.list_(pa.int64())),
        pa.array([[1], [None], [2, 3]], pa.list_(pa.int64())),
    ]:
        with pytest.raises(NullValueError, match="seq"):
            convert(batch(seq=column), list_format=list_format)


LISTS_WITH_NULLS = pa.array([[1, None], None, [2, 3, 4], [], [None]], pa.list_(pa.int64()))


@pytest.mark.parametrize("rows", [None, [4, 2, 0, 1, 3]], ids=["in-order", "taken"])
@pytest.mark.parametrize("policy", ["fill", "mask"])
def test_lists_with_nulls_padded_fill_and_mask(policy: str, rows: list[int] | None) -> None:
    """A null list is empty, a null value is filled (0); "mask" adds both validities."""
    order = rows if rows is not None else list(range(5))
    raw = LISTS_WITH_NULLS.to_pylist()
    out = Converter(batch(seq=LISTS_WITH_NULLS).schema, null_policy=policy, pad_value=-1)(
        batch(seq=LISTS_WITH_NULLS), None if rows is None else np.array(rows)
    )
    lengths = out["seq_lengths"].tolist()
    assert lengths == [len(raw[i] or []) for i in order]
    got = [row[:n] for row, n in zip(out["seq"].tolist(), lengths, strict=True)]
    assert got == [[0 if v is None else v for v in raw[i] or []] for i in order]
    assert all(
        v == -1 for row, n in zip(out["seq"].tolist(), lengths, strict=True) for v in row[n:]
    )
    if policy == "fill":
        assert "seq_valid" not in out and "seq_values_valid" not in out
        return
    assert out["seq_valid"].tolist() == [raw[i] is not None for i in order]
    values_valid = [
        row[:n] for row, n in zip(out["seq_values_valid"].tolist(), lengths, strict=True)
    ]
    assert values_valid == [[v is not None for v in raw[i] or []] for i in order]


def test_lists_with_nulls_offsets_mask() -> None:
    out = convert(batch(seq=LISTS_WITH_NULLS), list_format="offsets", null_policy="mask")
    assert out["seq_offsets"].tolist() == [0, 2, 2, 5, 5, 6]
    assert out["seq"].tolist() == [1, 0, 2, 3, 4, 0]
    assert out["seq_values_valid"].tolist() == [True, False, True, True, True, False]
    assert out["seq_valid"].tolist() == [True, False, True, True, True]


def test_list_masks_are_there_without_nulls() -> None:
    """Under "mask" the keys are in every batch, nulls or not (a collate needs fixed keys)."""
    out = convert(batch(seq=pa.array([[1], [2, 3]])), null_policy="mask")
    assert out["seq_valid"].tolist() == [True, True]
    assert out["seq_values_valid"].tolist() == [[True, False], [True, True]]


def test_fixed_size_lists_with_nulls_raise_naming_the_column() -> None:
    for column in [
        pa.array([[1, 2], None, [3, 4]], pa.list_(pa.float32(), 2)),
        pa.array([[1, 2], [None, 5], [3, 4]], pa.list_(pa.float32(), 2)),
    ]:
        with pytest.raises(NullValueError, match="vec"):
            convert(batch(vec=column))


def test_fixed_size_list_masks_of_shuffled_rows_without_nulls() -> None:
    rb = batch(emb=pa.FixedSizeListArray.from_arrays(pa.array(np.arange(30, dtype=np.float32)), 3))
    out = convert_rows(rb, np.array([3, 1]), null_policy="mask")
    assert out["emb"].tolist() == [[9, 10, 11], [3, 4, 5]]
    assert out["emb_valid"].tolist() == [True, True]
    assert out["emb_values_valid"].tolist() == [[True] * 3] * 2  # (once a reshape error)


def convert_rows(rb: pa.RecordBatch, rows: np.ndarray, **kw: Any) -> dict[str, Any]:
    out: dict[str, Any] = Converter(rb.schema, **kw)(rb, rows)
    return out


def test_fixed_size_lists_with_nulls_fill_and_mask() -> None:
    column = pa.array([[1, 2], None, [None, 5]], pa.list_(pa.float32(), 2))
    out = convert(batch(vec=column), null_policy="mask")
    nan = float("nan")
    np.testing.assert_array_equal(out["vec"].numpy(), np.array([[1, 2], [nan, nan], [nan, 5]]))
    assert out["vec_valid"].tolist() == [True, False, True]
    assert out["vec_values_valid"].tolist() == [[True, True], [False, False], [False, True]]
    taken = Converter(batch(vec=column).schema, null_policy="fill")(
        batch(vec=column), np.array([2, 0])
    )
    np.testing.assert_array_equal(taken["vec"].numpy(), np.array([[nan, 5], [1, 2]]))


def test_null_type_is_a_list_of_none() -> None:
    out = convert(batch(x=pa.array([1, 2]), n=pa.nulls(2)))
    assert out["n"] == [None, None]


def test_nested_temporal_values_are_stored_integers_and_extensions_pyarrows_values() -> None:
    """Out-of-range timestamps inside a struct never reach datetime (no OverflowError)."""
    ts = pa.array([2**62, 0], pa.timestamp("ns"))
    st = pa.StructArray.from_arrays([ts], names=["t"])
    uuids = pa.ExtensionArray.from_storage(
        pa.uuid(), pa.array([b"a" * 16, b"b" * 16], pa.binary(16))
    )
    out = convert(batch(s=st, u=uuids))
    assert out["s"] == [{"t": 2**62}, {"t": 0}]
    assert out["u"] == [uuid.UUID(bytes=b"a" * 16), uuid.UUID(bytes=b"b" * 16)]


@pytest.mark.parametrize(
    "column",
    [
        pa.array(["a", "bb", None, "c"], pa.string_view()),
        pa.array([b"a", b"bb", None, b"c"], pa.binary_view()),
        pc.run_end_encode(pa.array([1, 1, 2, 2], pa.int32())),
    ],
    ids=["string_view", "binary_view", "run_end_encoded"],
)
def test_types_without_a_take_kernel_are_taken_keeping_their_type(column: pa.Array) -> None:
    rb = batch(c=column)
    out = Converter(rb.schema, output_format="arrow")(rb, np.array([3, 0, 2]))
    assert out.schema.field("c").type == column.type
    assert out.column("c").to_pylist() == [column.to_pylist()[i] for i in (3, 0, 2)]


def test_string_nulls_pass_through_as_none() -> None:
    out = convert(batch(s=pa.array(["a", None])))
    assert out["s"] == ["a", None]


# --- configuration errors ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value_type", "pad_value"),
    [(pa.int32(), float("nan")), (pa.uint8(), -1), (pa.int16(), 1.5)],
    ids=["nan-int32", "neg-uint8", "fraction-int16"],
)
def test_pad_value_the_list_type_cannot_hold_is_invalid(value_type, pad_value) -> None:
    schema = pa.schema([("seq", pa.list_(value_type))])
    with pytest.raises(InvalidArgumentError, match="pad_value"):
        Converter(schema, pad_value=pad_value)


# --- list columns, brute force against a naive reference --------------------------------------


LIST_VALUE_TYPES: list[tuple[pa.DataType, Any]] = [
    (pa.int8(), np.int8),
    (pa.int32(), np.int32),
    (pa.int64(), np.int64),
    (pa.float32(), np.float32),
]


PAD_VALUES = [0, -1, 7]


JUNK = 111  # values in the child array that belong to no output list


def list_column(
    lists: list[list[Any]],
    value_type: pa.DataType,
    *,
    large: bool = False,
    lead: int = 0,
    trail: int = 0,
    child_offset: int = 0,
) -> pa.Array:
    """A list array of ``lists`` whose values child holds ``lead`` junk values before the first
    list and ``trail`` after the last, and itself starts ``child_offset`` values into its data."""
    np_dtype = value_type.to_pandas_dtype()
    flat = np.array([v for r in lists for v in r], dtype=np_dtype)
    data = np.concatenate([np.full(child_offset + lead, JUNK, np_dtype), flat])
    data = np.concatenate([data, np.full(trail, JUNK, np_dtype)])
    values = pa.array(data, value_type).slice(child_offset)
    offsets = lead + np.concatenate([[0], np.cumsum([len(r) for r in lists])])
    if large:
        return pa.LargeListArray.from_arrays(pa.array(offsets, pa.int64()), values)
    return pa.ListArray.from_arrays(pa.array(offsets, pa.int32()), values)


def random_lists(rng: np.random.Generator, np_dtype: Any) -> list[list[Any]]:
    """Lists of random lengths; some draws: all empty, one long list last, all of one length."""
    n = int(rng.integers(0, 13))
    lengths = rng.integers(0, 6, size=n)
    shape = rng.integers(0, 5)
    if shape == 1:
        lengths[:] = 0
    elif shape == 2 and n:
        lengths[-1] = 20  # the longest list is the last one: no full window after it
    elif shape == 3:
        lengths[:] = rng.integers(1, 4)  # every list is as long as the longest
    if np.issubdtype(np_dtype, np.integer):
        make = lambda k: rng.integers(-100, 100, size=k).astype(np_dtype)  # noqa: E731
    else:
        make = lambda k: (rng.standard_normal(k) * 100).astype(np_dtype)  # noqa: E731
    return [make(int(k)).tolist() for k in lengths]


def random_rows(rng: np.random.Generator, n: int) -> np.ndarray | None:
    """None (all rows), a permutation, a subset, draws with repeats, or the last rows."""
    kind = rng.integers(0, 6)
    if kind == 0:
        return None
    if kind == 1:
        return rng.permutation(n)
    if kind == 2:
        return rng.choice(n, size=int(rng.integers(0, n + 1)), replace=False)
    if kind == 3:
        return rng.integers(0, n, size=int(rng.integers(0, 2 * n + 1))) if n else np.arange(0)
    if kind == 4:
        return np.array([n - 1, n - 1, 0, n - 1])[: 4 if n else 0] % max(n, 1)
    return np.arange(0)


def check_list_fields(rb: pa.RecordBatch, rows: np.ndarray | None, pad_value: Any) -> None:
    """``padded`` and ``offsets`` fields of column ``v`` against a Python reference."""
    lists = rb.column("v").to_pylist()
    chosen = lists if rows is None else [lists[i] for i in rows]
    lengths = [len(r) for r in chosen]
    np_dtype = rb.schema.field("v").type.value_type.to_pandas_dtype()
    context = f"lists={lists} rows={rows} pad={pad_value}"

    fields = Converter(rb.schema, list_format="padded", pad_value=pad_value).fields(rb, rows)
    assert [f.key for f in fields] == ["v", "v_lengths", "id"]
    got = {f.key: as_numpy(f) for f in fields}
    for f in fields:
        assert got[f.key].shape == f.shape, context
    assert got["v"].dtype == np_dtype, context
    assert got["v"].shape == (len(chosen), max(lengths, default=0)), context
    assert got["v"].tolist() == padded(chosen, pad_value), context
    assert got["v_lengths"].dtype.kind == "i", context
    assert got["v_lengths"].tolist() == lengths, context
    assert got["id"].tolist() == reference_rows(rb, "id", rows), context

    fields = Converter(rb.schema, list_format="offsets").fields(rb, rows)
    assert [f.key for f in fields] == ["v", "v_offsets", "id"]
    got = {f.key: as_numpy(f) for f in fields}
    for f in fields:
        assert got[f.key].shape == f.shape, context
    assert got["v"].dtype == np_dtype, context
    assert got["v"].tolist() == [v for r in chosen for v in r], context
    assert got["v_offsets"].tolist() == np.cumsum([0, *lengths]).tolist(), context


def reference_rows(rb: pa.RecordBatch, name: str, rows: np.ndarray | None) -> list[Any]:
    values = rb.column(name).to_pylist()
    return values if rows is None else [values[i] for i in rows]


@pytest.mark.parametrize("large", [False, True])
@pytest.mark.parametrize(("value_type", "np_dtype"), LIST_VALUE_TYPES, ids=str)
def test_padded_and_offsets_lists_match_a_python_reference(
    value_type: pa.DataType, np_dtype: Any, large: bool
) -> None:
    rng = np.random.default_rng([RNG_SEED, np.dtype(np_dtype).itemsize, int(large)])
    for _ in range(80):
        lists = random_lists(rng, np_dtype)
        layout = {
            "lead": int(rng.integers(0, 3)) * int(rng.integers(0, 2)),
            "trail": int(rng.integers(0, 3)) * int(rng.integers(0, 2)),
            "child_offset": int(rng.integers(0, 3)) * int(rng.integers(0, 2)),
        }
        column = list_column(lists, value_type, large=large, **layout)
        assert column.to_pylist() == lists
        rb = pa.RecordBatch.from_arrays(
            [column, pa.array(np.arange(len(lists)), pa.int64())], names=["v", "id"]
        )
        start = int(rng.integers(0, len(lists) + 1))
        sliced = [
            rb,
            rb.slice(start),
            rb.slice(start, int(rng.integers(0, len(lists) - start + 1))),
        ]
        for sub in sliced:
            rows = random_rows(rng, sub.num_rows)
            for pad_value in PAD_VALUES:
                check_list_fields(sub, rows, pad_value)


LONG_LAST = [[1, 2], [], [3], [4, 5, 6], [7] * 3 + list(range(8, 25))]  # 20 values last


@pytest.mark.parametrize(
    "lists",
    [
        LONG_LAST,
        [[], [], [], []],
        [[1, 2, 3], [4, 5, 6], [7, 8, 9], [10, 11, 12]],
        [[5], [6], [7], [8, 9, 10, 11, 12, 13]],
        [[9, 9, 9, 9]],
    ],
    ids=["long-list-last", "all-empty", "all-longest", "short-lists-then-long", "one"],
)
def test_padded_lists_every_short_row_selection(lists: list[list[int]]) -> None:
    rb = pa.RecordBatch.from_arrays(
        [list_column(lists, pa.int32()), pa.array(np.arange(len(lists)), pa.int64())],
        names=["v", "id"],
    )
    for sub in [rb, rb.slice(1), rb.slice(len(lists) - 1), rb.slice(0, len(lists) - 1)]:
        n = sub.num_rows
        selections = [
            np.array(rows, dtype=np.int64)
            for k in range(4)
            for rows in itertools.product(range(n), repeat=k)
        ]
        for rows in [None, *selections]:
            check_list_fields(sub, rows, -1)


def test_padded_list_at_the_very_end_of_the_values_shapes() -> None:
    rb = pa.RecordBatch.from_arrays(
        [list_column(LONG_LAST, pa.int8()), pa.array(np.arange(5), pa.int64())], names=["v", "id"]
    )
    out = Converter(rb.schema, pad_value=7, output_format="numpy")(rb, np.array([4, 0, 4]))
    assert out["v"].shape == (3, 20)
    assert out["v"][0].tolist() == out["v"][2].tolist() == LONG_LAST[4]
    assert out["v"][1].tolist() == [1, 2] + [7] * 18
    assert out["v_lengths"].tolist() == [20, 2, 20]
    # Without the long list, the width is that of the longest list chosen.
    out = Converter(rb.schema, pad_value=7)(rb.slice(1, 3))
    assert out["v"].tolist() == [[7, 7, 7], [3, 7, 7], [4, 5, 6]]
    assert out["v"].dtype == torch.int8


def test_padded_lists_allocate_in_proportion_to_the_output_not_the_column() -> None:
    # A block column can hold millions of values; converting 64 rows of it must not copy it
    # (an np.take over the sliding-window view once did: len(values) x longest elements).
    import tracemalloc

    lengths = np.full(100_000, 50)
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
    values = pa.array(np.arange(offsets[-1], dtype=np.int32))
    column = pa.ListArray.from_arrays(pa.array(offsets), values)
    batch = pa.RecordBatch.from_arrays([column], ["t"])
    converter = Converter(batch.schema, list_format="padded")
    rows = np.random.default_rng(0).permutation(len(lengths))[:64]
    tracemalloc.start()
    try:
        out = converter(batch, rows)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert out["t"].shape == (64, 50)
    assert out["t"][:, 0].tolist() == (offsets[rows]).tolist()
    assert peak < 2_000_000, peak  # the column is 20 MB; the output 12.8 KB
