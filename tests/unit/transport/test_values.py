"""How each value of a packed batch lies in the shared buffer (`transport.values`): strings and
binary as Arrow offsets and bytes, unpacked to the lists direct conversion gives; nulls and large
types pickled instead, and a value that cannot be pickled refused in the worker."""

from __future__ import annotations

import pickle
from multiprocessing.reduction import ForkingPickler

import numpy as np
import pyarrow as pa
import pytest
import torch.multiprocessing  # noqa: F401 (registers torch's shared-memory reductions with ForkingPickler)

from tests.unit.transport.batches import (
    PERMUTATION,
    WORDS,
    assert_same_batch,
    in_shared_memory,
    packed_entries,
    reference,
    string_batch,
)
from torch_dataloader_utils.convert import Converter, Field
from torch_dataloader_utils.errors import DataError
from torch_dataloader_utils.transport import (
    Bundle,
    pack,
)
from torch_dataloader_utils.transport.values import _Pickled, _Strings

STRING_CASES: list[tuple[str, tuple[int, int] | None, list[int] | None]] = [
    ("whole", None, None),
    ("sliced", (3, 7), None),
    ("sliced-permuted", (3, 7), PERMUTATION.tolist()),
    ("permuted", None, np.random.default_rng(3).permutation(len(WORDS)).tolist()),
    ("last-rows-repeated", None, [10, 10, 0, 9, 10]),
    ("one-row-at-the-end", (10, 1), None),
    ("zero-rows-slice", (4, 0), None),
    ("zero-rows-slice-at-the-end", (len(WORDS), 0), None),
    ("zero-rows-taken", (2, 5), []),
    ("only-empty-strings", None, [1, 5, 1]),
]


@pytest.mark.parametrize(("case", "window", "rows"), STRING_CASES, ids=[c[0] for c in STRING_CASES])
def test_strings_and_binary_cross_as_buffers_and_unpack_to_the_direct_lists(
    case: str, window: tuple[int, int] | None, rows: list[int] | None
) -> None:
    converter, rb = string_batch()
    if window is not None:
        rb = rb.slice(*window)
    index = None if rows is None else np.array(rows, dtype=np.int64)
    bundle = pack([converter.fields(rb, index)])
    # The buffer path was taken (not the pickled-list fallback).
    assert all(
        isinstance(w, _Strings) for w in packed_entries(bundle, "s") + packed_entries(bundle, "b")
    )
    copy = pickle.loads(ForkingPickler.dumps(bundle))  # as the DataLoader sends it
    for got in [copy.unpack()[0], bundle.unpack()[0]]:
        assert_same_batch(got, converter(rb, index))
        assert got["s"] == reference(rb, "s", index)
        assert got["b"] == reference(rb, "b", index)
        assert all(type(v) is str for v in got["s"]) and all(type(v) is bytes for v in got["b"])
        assert got["id"].tolist() == reference(rb, "id", index)


def test_column_of_only_empty_strings_has_an_empty_values_buffer() -> None:
    rb = pa.RecordBatch.from_arrays(
        [pa.array([""] * 5, pa.string()), pa.array([b""] * 5, pa.binary())], names=["s", "b"]
    )
    converter = Converter(rb.schema)
    for sub, rows in [
        (rb, None),
        (rb.slice(2), None),
        (rb, np.array([4, 0])),
        (rb.slice(1, 0), None),
    ]:
        bundle = pack([converter.fields(sub, rows)])
        strings = packed_entries(bundle, "s") + packed_entries(bundle, "b")
        assert all(isinstance(w, _Strings) and w.nbytes == 0 for w in strings)
        (got,) = bundle.unpack()
        n = sub.num_rows if rows is None else len(rows)
        assert got == {"s": [""] * n, "b": [b""] * n}
        assert got == converter(sub, rows)


def test_strings_whose_offsets_do_not_start_at_zero_are_rebased() -> None:
    # An unsliced array whose first offset is 5 (e.g. made over a shared bytes buffer).
    data = pa.py_buffer("junk!abcdéf".encode())
    offsets = pa.py_buffer(np.array([5, 6, 6, 8, 12], dtype=np.int32))
    array = pa.Array.from_buffers(pa.string(), 4, [None, offsets, data])
    assert array.offset == 0 and array.to_pylist() == ["a", "", "bc", "déf"]
    rb = pa.RecordBatch.from_arrays([array], names=["s"])
    converter = Converter(rb.schema)
    for sub, rows in [(rb, None), (rb.slice(1), None), (rb, np.array([3, 2, 0]))]:
        got = pack([converter.fields(sub, rows)]).unpack()[0]
        assert got["s"] == converter(sub, rows)["s"] == reference(sub, "s", rows)


def test_strings_with_nulls_and_large_strings_fall_back_to_lists() -> None:
    words = ["a", None, "", "héllo", None, "z"]
    blobs = [b"\x00", b"", None, b"q", b"r", None]
    rb = pa.RecordBatch.from_arrays(
        [
            pa.array(words, pa.string()),
            pa.array(blobs, pa.binary()),
            pa.array(words[::-1], pa.large_string()),
            pa.array(blobs[::-1], pa.large_binary()),
        ],
        names=["s", "b", "ls", "lb"],
    )
    converter = Converter(rb.schema)
    cases = [
        (rb, None),
        (rb.slice(1, 4), None),
        (rb, np.array([4, 0, 1, 5, 2, 3])),
        (rb.slice(1, 4), np.array([3, 0, 0])),
    ]
    bundle = pack([converter.fields(sub, rows) for sub, rows in cases])
    for name in ["s", "b", "ls", "lb"]:
        for where, (sub, rows) in zip(packed_entries(bundle, name), cases, strict=True):
            # Large types always fall back; string/binary only when the rows sent hold a null.
            fallback = name.startswith("l") or None in reference(sub, name, rows)
            assert isinstance(where, _Pickled if fallback else _Strings), (name, where)
    unpacked = pickle.loads(ForkingPickler.dumps(bundle)).unpack()
    for got, (sub, rows) in zip(unpacked, cases, strict=True):
        assert_same_batch(got, converter(sub, rows))
        for name in ["s", "b", "ls", "lb"]:
            assert got[name] == reference(sub, name, rows), name
    # The None are where the nulls were.
    assert unpacked[0]["s"] == words
    assert unpacked[2]["s"] == [None, "a", None, "z", "", "héllo"]
    assert [v is None for v in unpacked[2]["b"]] == [False, False, False, True, True, False]


def test_large_strings_given_to_pack_as_arrow_fall_back_to_lists() -> None:
    # The converter makes lists of large types itself; pack must cope with the Arrow arrays
    # too (64-bit offsets: reading them as 32-bit ones would garble the values).
    words = ["a", "", "héllo", "zz" * 30]
    large = pa.array(words, pa.large_string())
    large_binary = pa.array([w.encode() for w in words], pa.large_binary())
    fields = [
        [Field("ls", large, None), Field("lb", large_binary, None)],
        [Field("ls", large.slice(1, 2), None), Field("lb", large_binary.slice(2), None)],
    ]
    bundle = pack(fields)
    assert all(isinstance(w, _Pickled) for k in ["ls", "lb"] for w in packed_entries(bundle, k))
    assert bundle.unpack() == [
        {"ls": words, "lb": [w.encode() for w in words]},
        {"ls": words[1:3], "lb": [w.encode() for w in words[2:]]},
    ]


def test_string_slice_without_nulls_of_a_column_with_nulls_uses_buffers() -> None:
    rb = pa.RecordBatch.from_arrays([pa.array(["a", None, "bc", "", "d"], pa.string())], ["s"])
    converter = Converter(rb.schema)
    sub = rb.slice(2)
    assert sub.column("s").null_count == 0
    bundle = pack([converter.fields(sub), converter.fields(rb, np.array([4, 0, 2]))])
    assert all(isinstance(w, _Strings) for w in packed_entries(bundle, "s"))
    assert [b["s"] for b in bundle.unpack()] == [["bc", "", "d"], ["d", "a", "bc"]]


def test_strings_travel_in_shared_memory_not_in_the_pickle() -> None:
    words = [f"word-{i}-" + "é" * (i % 50) for i in range(2000)]
    rb = pa.RecordBatch.from_arrays(
        [pa.array(words, pa.string()), pa.array([w.encode() for w in words], pa.binary())],
        names=["s", "b"],
    )
    converter = Converter(rb.schema)
    rows = np.random.default_rng(5).permutation(len(words))
    bundle = pack([converter.fields(rb.slice(3), None), converter.fields(rb, rows)])
    blob = ForkingPickler.dumps(bundle)
    text_bytes = sum(len(w.encode()) for w in words)
    assert len(blob) < text_bytes // 20  # the ~100 kB of text is not in the message
    copy = pickle.loads(blob)
    assert in_shared_memory(copy.buffer)
    first, second = copy.unpack()
    assert first["s"] == words[3:]
    assert first["b"] == [w.encode() for w in words[3:]]
    assert second["s"] == [words[i] for i in rows]
    assert second["b"] == [words[i].encode() for i in rows]


def test_zero_length_string_array_without_an_offsets_buffer_packs() -> None:
    # Regression: pack read the absent offsets buffer with np.frombuffer (TypeError).
    array = pa.Array.from_buffers(pa.string(), 0, [None, None, pa.py_buffer(b"")])
    array.validate(full=True)  # valid Arrow: a zero-length array needs no offsets
    rb = pa.RecordBatch.from_arrays([array], ["s"])
    converter = Converter(rb.schema)
    assert converter(rb) == {"s": []}
    assert pack([converter.fields(rb)]).unpack() == [{"s": []}]


def test_values_that_cannot_be_pickled_fail_in_the_worker_naming_the_column() -> None:
    """A message that fails to pickle in DataLoader's feeder thread is dropped silently; the
    worker pickles Python values itself and raises, naming the column."""
    with pytest.raises(DataError, match=r"'obj'.*cannot be sent"):
        pack([[Field("obj", [lambda: 0], None)]])
    with pytest.raises(DataError, match="cannot be sent from its worker"):
        Bundle([[lambda: 0]]).seal()
    sealed = Bundle([pa.record_batch({"x": [1, 2]})]).seal()
    assert pickle.loads(pickle.dumps(sealed)).unpack()[0].column("x").to_pylist() == [1, 2]


def test_plain_numbers_travel_as_themselves_and_other_values_pickled() -> None:
    # A packed batch's max_seqlen is an int: it crosses in the message as it is (a blob of its
    # own cost ~1 µs a batch each side); numpy scalars and lists keep the pickled blob.
    values = {"n": 963, "f": 0.5, "b": True, "np": np.int64(7), "list": [1, "a"]}
    bundle = pack([[Field(k, v, None) for k, v in values.items()]])
    kinds = {k: type(packed_entries(bundle, k)[0]) for k in values}
    assert kinds == {"n": int, "f": float, "b": bool, "np": _Pickled, "list": _Pickled}
    (out,) = pickle.loads(ForkingPickler.dumps(bundle)).unpack()
    assert out == values
    assert {k: type(v) for k, v in out.items()} == {k: type(v) for k, v in values.items()}
