"""Bundles: packed batches cross processes in one shared buffer and unpack to the same values."""

from __future__ import annotations

import itertools
import pickle
from multiprocessing.reduction import ForkingPickler
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
import torch
import torch.multiprocessing  # registers torch's shared-memory reductions with ForkingPickler

from tests.conftest import make_table
from torch_dataloader_utils import transport
from torch_dataloader_utils.convert import Converter, Field, as_tensor
from torch_dataloader_utils.errors import DataError
from torch_dataloader_utils.transport import (
    Bundle,
    PackedBundle,
    Unbundler,
    pack,
)
from torch_dataloader_utils.transport.values import _Pickled, _Strings


def record_batches() -> tuple[Converter, list[pa.RecordBatch]]:
    """Batches of every kind the converter makes, incl. sliced, empty, and odd byte sizes."""
    table = make_table(np.arange(300), emb_dim=3)
    table = table.append_column("small", pa.array(np.arange(300) % 100, pa.int8()))
    table = table.append_column("half", pa.array(np.arange(300) / 7, pa.float16()))
    table = table.append_column(
        "maybe", pa.array([None if i % 4 == 0 else i * 1.5 for i in range(300)], pa.float64())
    )
    rb = table.combine_chunks().to_batches()[0]
    converter = Converter(table.schema, null_policy="mask", pad_value=-1)
    slices = [(0, 64), (64, 13), (77, 0), (79, 1), (3, 200)]
    return converter, [rb.slice(start, length) for start, length in slices]


def direct(converter: Converter, rb: pa.RecordBatch) -> dict[str, Any]:
    return {f.key: as_tensor(f) for f in converter.fields(rb)}


def assert_same_batch(got: dict[str, Any], want: dict[str, Any]) -> None:
    assert list(got) == list(want)
    for key, value in want.items():
        if isinstance(value, torch.Tensor):
            other = got[key]
            assert isinstance(other, torch.Tensor), key
            assert other.dtype == value.dtype, key
            assert other.shape == value.shape, key
            torch.testing.assert_close(other, value, rtol=0, atol=0, equal_nan=True, msg=key)
        else:
            assert got[key] == value, key


def test_pack_unpack_round_trip_equals_direct_conversion() -> None:
    converter, batches = record_batches()
    bundle = pack([converter.fields(rb) for rb in batches])
    assert isinstance(bundle, PackedBundle)
    unpacked = bundle.unpack()
    assert len(unpacked) == len(batches)
    for got, rb in zip(unpacked, batches, strict=True):
        want = direct(converter, rb)
        assert_same_batch(got, want)
        # And against the source Arrow data.
        assert got["id"].tolist() == rb.column("id").to_pylist()
        assert got["flag"].tolist() == rb.column("flag").to_pylist()
        assert got["name"] == rb.column("name").to_pylist()
        maybe = rb.column("maybe").to_numpy(zero_copy_only=False)  # nulls become NaN
        np.testing.assert_array_equal(got["maybe"].numpy(), maybe)
        assert got["maybe_valid"].tolist() == rb.column("maybe").is_valid().to_pylist()
        lengths = [len(r) for r in rb.column("tokens").to_pylist()]
        assert got["tokens_lengths"].tolist() == lengths
        assert [row[:n] for row, n in zip(got["tokens"].tolist(), lengths, strict=True)] == (
            rb.column("tokens").to_pylist()
        )


def in_shared_memory(tensor: torch.Tensor) -> bool:
    """Whether ``tensor``'s memory is shared between processes: torch's (/dev/shm) or one of
    our memfds, as this process's memory map names it."""
    if tensor.is_shared():
        return True
    address = tensor.untyped_storage().data_ptr()
    with open("/proc/self/maps") as maps:
        for line in maps:
            low, high = (int(x, 16) for x in line.split()[0].split("-"))
            if low <= address < high:
                return "/memfd:tdu-bundle" in line
    return False


@pytest.fixture
def fresh(monkeypatch: pytest.MonkeyPatch) -> None:
    """A pool and a list of lent buffers of this test's own (the buffers other tests left in
    the process's pool would be taken first)."""
    monkeypatch.setattr(transport.buffers, "_pool", transport.BufferPool())
    monkeypatch.setattr(transport.buffers, "_lent", transport.Lent())
    monkeypatch.setattr(transport.buffers, "_received", transport.Received())


def test_one_shared_buffer_crosses_and_batches_are_views_of_it() -> None:
    converter, batches = record_batches()
    bundle = pack([converter.fields(rb) for rb in batches])
    assert isinstance(bundle.buffer, torch.Tensor)
    assert bundle.buffer.dtype == torch.uint8
    assert in_shared_memory(bundle.buffer)
    unpacked = bundle.unpack()
    tensors = [v for b in unpacked for v in b.values() if isinstance(v, torch.Tensor)]
    assert tensors
    start = bundle.buffer.data_ptr()
    nonempty = [t for t in tensors if t.numel()]
    # No copy: every tensor lies in the shared buffer's memory.
    assert all(start <= t.data_ptr() < start + bundle.buffer.numel() for t in nonempty)
    # The views do not overlap: writing through one changes no other.
    spans = sorted((t.data_ptr(), t.data_ptr() + t.numel() * t.element_size()) for t in nonempty)
    assert all(a[1] <= b[0] for a, b in itertools.pairwise(spans))


@pytest.mark.usefixtures("fresh")
def test_a_buffer_goes_back_once_its_batches_are_dropped_and_held_ones_stay_intact() -> None:
    converter, batches = record_batches()
    first = pack([converter.fields(rb) for rb in batches])
    shared = first.buffer.untyped_storage().data_ptr()
    held = first.unpack()  # the user keeps these batches
    expected = [
        {k: (v.clone() if isinstance(v, torch.Tensor) else v) for k, v in b.items()} for b in held
    ]
    # While they are held the buffer stays out of the pool...
    for _ in range(3):
        other = pack([converter.fields(rb) for rb in batches])
        assert other.buffer.untyped_storage().data_ptr() != shared
        other.unpack()
    for batch, reference in zip(held, expected, strict=True):
        assert_same_batch(batch, reference)
    # ...and once dropped, the next unpack gives it back: the message after reuses it.
    del held, batch
    pack([converter.fields(batches[0])]).unpack()
    again = pack([converter.fields(rb) for rb in reversed(batches)])
    assert again.buffer.untyped_storage().data_ptr() == shared
    for got, rb in zip(again.unpack(), reversed(batches), strict=True):
        assert_same_batch(got, direct(converter, rb))


def test_an_unreleased_buffer_is_not_reused() -> None:
    converter, batches = record_batches()
    first = pack([converter.fields(rb) for rb in batches])  # never unpacked: still in flight
    second = pack([converter.fields(rb) for rb in batches])
    assert second.buffer.untyped_storage().data_ptr() != first.buffer.untyped_storage().data_ptr()
    assert [b.keys() for b in first.unpack()] == [b.keys() for b in second.unpack()]


def test_pack_copies_so_the_bundle_outlives_its_sources() -> None:
    source = np.arange(10, dtype=np.int64)
    bundle = pack([[Field("a", source, (2, 5))]])
    source[:] = -1
    assert bundle.unpack()[0]["a"].tolist() == [[0, 1, 2, 3, 4], [5, 6, 7, 8, 9]]


def test_empty_pack() -> None:
    assert pack([]).unpack() == []
    only_lists = pack([[Field("s", ["a", "b"], None)], []])
    assert only_lists.unpack() == [{"s": ["a", "b"]}, {}]


def test_packed_bundle_survives_torch_multiprocessing_pickling() -> None:
    converter, batches = record_batches()
    bundle = pack([converter.fields(rb) for rb in batches])
    blob = ForkingPickler.dumps(bundle)
    # Shared memory travels by handle, not by value: the message is far smaller than the data.
    assert len(blob) < bundle.buffer.numel()
    copy = pickle.loads(blob)
    assert isinstance(copy, PackedBundle)
    assert in_shared_memory(copy.buffer)
    assert torch.equal(copy.buffer, bundle.buffer)
    for got, rb in zip(copy.unpack(), batches, strict=True):
        assert_same_batch(got, direct(converter, rb))


def test_bundle_keeps_items_in_order() -> None:
    items = [{"a": torch.arange(3)}, "x", [1, 2], {"b": ["s"]}]
    bundle = Bundle(items)
    assert bundle.unpack() == items
    copy = pickle.loads(ForkingPickler.dumps(bundle))
    assert torch.equal(copy.unpack()[0]["a"], torch.arange(3))
    assert copy.unpack()[1:] == items[1:]


def test_unbundle_flattens_bundles_and_passes_plain_items_through() -> None:
    packed = pack(
        [
            [Field("v", np.array([1, 2], np.int32), (2,))],
            [Field("v", np.array([3], np.int32), (1,))],
        ]
    )
    plain = {"v": torch.tensor([9], dtype=torch.int32)}
    stream = [plain, Bundle(["a", "b"]), packed, "c", Bundle([]), 7]
    unpack = Unbundler()
    out = [batch for item in stream for batch in unpack(item)]
    assert out[0] is plain
    assert out[1:3] == ["a", "b"]
    assert out[3]["v"].tolist() == [1, 2]
    assert out[4]["v"].tolist() == [3]
    assert out[5:] == ["c", 7]
    assert len(out) == 7


# --- strings and binary: Arrow buffers packed into the shared buffer ---------------------------

WORDS = ["a", "", "héllo", "x" * 100, "日本語", "", "b", "🙂 ok", "c", "nul\x00byte", "end"]
BLOBS = [w.encode() for w in WORDS[:-1]] + [b"\xff\x00\xfe"]  # the last one is not UTF-8


def string_batch() -> tuple[Converter, pa.RecordBatch]:
    rb = pa.RecordBatch.from_arrays(
        [
            pa.array(WORDS, pa.string()),
            pa.array(np.arange(len(WORDS)), pa.int64()),
            pa.array(BLOBS, pa.binary()),
        ],
        names=["s", "id", "b"],
    )
    return Converter(rb.schema), rb


def packed_entries(bundle: PackedBundle, key: str) -> list[Any]:
    """What the bundle's layouts hold for ``key``, batch by batch (the packing path taken)."""
    return [where for layout in bundle.layouts for k, _, _, where in layout if k == key]


def reference(rb: pa.RecordBatch, name: str, rows: np.ndarray | None) -> list[Any]:
    values = rb.column(name).to_pylist()
    return values if rows is None else [values[i] for i in rows]


PERMUTATION = np.array([6, 0, 3, 1, 5, 2, 4])  # of the 7 rows of rb.slice(3, 7)
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


def span(start: int, nbytes: int) -> tuple[int, int]:
    return start, start + nbytes


def test_several_batches_with_different_string_columns_in_one_bundle() -> None:
    converter, words = string_batch()
    table_converter, batches = record_batches()
    other = pa.RecordBatch.from_arrays(
        [
            pa.array(["q" * 7, "", "ü"], pa.string()),
            pa.array([0.5, 1.5, 2.5], pa.float32()),
            pa.array([b"", b"\x01\x02\x03", b"\x04"], pa.binary()),
        ],
        names=["t", "f", "u"],
    )
    other_converter = Converter(other.schema)
    parts: list[tuple[Converter, pa.RecordBatch, np.ndarray | None]] = [
        (converter, words, None),
        (table_converter, batches[1], np.arange(13)[::-1].copy()),
        (other_converter, other, None),
        (converter, words.slice(4, 0), None),
        (converter, words.slice(3, 7), PERMUTATION),
        (other_converter, other.slice(1), np.array([1, 0, 1])),
        (table_converter, batches[4], None),
    ]
    bundle = pack([c.fields(rb, rows) for c, rb, rows in parts])
    # Every region of the buffer (tensors, string offsets, string bytes) is inside it and
    # apart from every other.
    spans = []
    for layout in bundle.layouts:
        for _, dtype, shape, where in layout:
            if isinstance(where, _Strings):
                spans.append(span(where.offsets_at, 4 * (where.rows + 1)))
                spans.append(span(where.values_at, where.nbytes))
            elif dtype is not None and shape is not None:
                spans.append(span(where, int(np.prod(shape)) * dtype.itemsize))
    nonempty = sorted(s for s in spans if s[1] > s[0])
    assert all(a[1] <= b[0] for a, b in itertools.pairwise(nonempty))
    assert all(a >= 0 and b <= bundle.buffer.numel() for a, b in spans)
    unpacked = pickle.loads(ForkingPickler.dumps(bundle)).unpack()
    assert len(unpacked) == len(parts)
    for got, (c, rb, rows) in zip(unpacked, parts, strict=True):
        assert_same_batch(got, c(rb, rows))
        for key, value in got.items():
            if key in rb.schema.names and not isinstance(value, torch.Tensor):
                assert value == reference(rb, key, rows), key
    assert unpacked[2]["t"] == ["q" * 7, "", "ü"]
    assert unpacked[5]["u"] == [b"\x04", b"\x01\x02\x03", b"\x04"]


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


def plain_pin_error() -> RuntimeError | None:
    """What pinning a plain CPU tensor raises here (CPU-only torch), or None when it works."""
    try:
        torch.empty(1).pin_memory()
    except RuntimeError as error:
        return error
    return None


def test_packed_bundle_pin_memory_is_an_equivalent_bundle() -> None:
    converter, batches = record_batches()
    strings_converter, words = string_batch()
    parts = [(converter, rb, None) for rb in batches] + [
        (strings_converter, words, None),
        (strings_converter, words.slice(3, 7), PERMUTATION),
    ]
    bundle = pack([c.fields(rb, rows) for c, rb, rows in parts])
    error = plain_pin_error()
    if error is not None:
        # No accelerator: pinning the bundle fails exactly as pinning a plain tensor does...
        with pytest.raises(type(error)) as raised:
            bundle.pin_memory()
        assert str(raised.value) == str(error)
        # ... and leaves the bundle whole.
        pinned = bundle
    else:
        pinned = bundle.pin_memory()
        assert isinstance(pinned, PackedBundle)
        assert pinned.buffer.is_pinned()
        assert pinned.layouts == bundle.layouts
    unpacked = pinned.unpack()
    assert len(unpacked) == len(parts)
    for got, (c, rb, rows) in zip(unpacked, parts, strict=True):
        assert_same_batch(got, c(rb, rows))
        if error is None:
            assert all(v.is_pinned() for v in got.values() if isinstance(v, torch.Tensor))


def test_zero_length_string_array_without_an_offsets_buffer_packs() -> None:
    # Regression: pack read the absent offsets buffer with np.frombuffer (TypeError).
    array = pa.Array.from_buffers(pa.string(), 0, [None, None, pa.py_buffer(b"")])
    array.validate(full=True)  # valid Arrow: a zero-length array needs no offsets
    rb = pa.RecordBatch.from_arrays([array], ["s"])
    converter = Converter(rb.schema)
    assert converter(rb) == {"s": []}
    assert pack([converter.fields(rb)]).unpack() == [{"s": []}]


def test_batches_kept_by_the_user_survive_later_bundles() -> None:
    converter, batches = record_batches()
    strings_converter, words = string_batch()

    def send(parts: list[tuple[Converter, pa.RecordBatch, np.ndarray | None]]) -> list[Any]:
        bundle = pack([c.fields(rb, rows) for c, rb, rows in parts])
        unpacked: list[Any] = pickle.loads(ForkingPickler.dumps(bundle)).unpack()
        assert len(unpacked) == len(parts)
        for got, (c, rb, rows) in zip(unpacked, parts, strict=True):
            assert_same_batch(got, c(rb, rows))
        return unpacked

    whole = send([(converter, batches[0], None), (strings_converter, words, PERMUTATION)])[0]
    view = send([(converter, batches[4], None)])[0]["tokens"][1:, :2]  # only a view kept
    array = send([(converter, batches[1], None)])[0]["x"].numpy()  # only a numpy array kept
    want_view = direct(converter, batches[4])["tokens"][1:, :2]
    want_array = batches[1].column("x").to_numpy()
    for k in range(10):  # reuse any recycled buffers and landing regions several times over
        rows = np.random.default_rng(k).permutation(64)
        send([(converter, batches[0], rows), (strings_converter, words.slice(2), None)])
        send([(converter, batches[4], np.arange(200)[::-1].copy())])
        assert_same_batch(whole, direct(converter, batches[0]))
        assert torch.equal(view, want_view)
        np.testing.assert_array_equal(array, want_array)


# --- wide binary columns through real workers ------------------------------------------------


WIDE_ROWS, WIDE_BATCH = 64, 16


def wide_value(i: int) -> bytes | None:
    """Row ``i``'s ``bin``: empty, small, or 1.4 MB (rows 16-31: one batch > BUNDLE_BYTES);
    null in some rows of the last batch only, so the other batches take the buffer path."""
    if i >= 48 and i % 3 == 0:
        return None
    size = 0 if i % 5 == 0 else 1_400_000 if 16 <= i < 32 else 1 + i * 37 % 300
    return (i.to_bytes(4, "little") * (size // 4 + 1))[:size]


def wide_text(i: int) -> str:
    return "" if i % 4 == 0 else f"é{i}"


def write_wide(path: Any) -> Any:
    import pyarrow.parquet as pq

    ids = list(range(WIDE_ROWS))
    table = pa.table(
        {
            "id": pa.array(ids, pa.int64()),
            "bin": pa.array([wide_value(i) for i in ids], pa.binary()),
            "s": pa.array([wide_text(i) for i in ids], pa.string()),
        }
    )
    pq.write_table(table, path, row_group_size=WIDE_BATCH)
    return path


def test_wide_binary_batches_pack_strings_after_the_tensors(tmp_path: Any) -> None:
    import pyarrow.parquet as pq

    table = pq.read_table(write_wide(tmp_path / "wide.parquet"))
    converter = Converter(table.schema)
    batches = table.to_batches(max_chunksize=WIDE_BATCH)
    bundle = pack([converter.fields(rb) for rb in batches])
    assert bundle.end - bundle.tensors_end > transport.BUNDLE_BYTES  # the big batch is in it
    strings = [
        w for k in ["bin", "s"] for w in packed_entries(bundle, k) if isinstance(w, _Strings)
    ]
    assert len(strings) == 7  # every batch but the last, whose bin has nulls (a list)
    assert all(w.offsets_at >= bundle.tensors_end for w in strings)  # not copied on landing
    unpacked = bundle.unpack()
    for got, rb in zip(unpacked, batches, strict=True):
        assert_same_batch(got, converter(rb))
        assert got["bin"] == [wide_value(i) for i in rb.column("id").to_pylist()]
    assert int(bundle.buffer[0]) == 1  # its batches are alive: not released
    del unpacked, got
    pack([]).unpack()  # (an unpack gives back the buffers nothing views)
    assert int(bundle.buffer[0]) == 0


@pytest.mark.timeout(120)
@pytest.mark.parametrize("context", ["fork", "spawn"])
def test_wide_binary_column_crosses_real_workers_intact(tmp_path: Any, context: str) -> None:
    import torch_dataloader_utils as tdu

    loader = tdu.create_dataloader(
        str(write_wide(tmp_path / "wide.parquet")),
        batch_size=WIDE_BATCH,
        shuffle=False,  # keeps the > BUNDLE_BYTES batch and the null-free batches whole
        num_workers=2,
        multiprocessing_context=context,
        null_policy="error",
    )
    for epoch in range(2):
        loader.set_epoch(epoch)
        seen: list[int] = []
        for batch in loader:
            ids = batch["id"].tolist()
            seen.extend(ids)
            assert batch["bin"] == [wide_value(i) for i in ids]
            assert batch["s"] == [wide_text(i) for i in ids]
            assert all(type(v) is bytes for v in batch["bin"] if v is not None)
        assert sorted(seen) == list(range(WIDE_ROWS))  # every row exactly once


def test_values_that_cannot_be_pickled_fail_in_the_worker_naming_the_column() -> None:
    """A message that fails to pickle in DataLoader's feeder thread is dropped silently; the
    worker pickles Python values itself and raises, naming the column."""
    with pytest.raises(DataError, match=r"'obj'.*cannot be sent"):
        pack([[Field("obj", [lambda: 0], None)]])
    with pytest.raises(DataError, match="cannot be sent from its worker"):
        Bundle([[lambda: 0]]).seal()
    sealed = Bundle([pa.record_batch({"x": [1, 2]})]).seal()
    assert pickle.loads(pickle.dumps(sealed)).unpack()[0].column("x").to_pylist() == [1, 2]
