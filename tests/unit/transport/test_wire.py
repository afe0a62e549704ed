"""Bundles: packed batches cross processes in one shared buffer and unpack to the same values
(how each value lies in the buffer: test_values.py)."""

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

from tests.unit.transport.batches import (
    PERMUTATION,
    assert_same_batch,
    direct,
    in_shared_memory,
    packed_entries,
    record_batches,
    reference,
    string_batch,
)
from torch_dataloader_utils import transport
from torch_dataloader_utils.convert import Converter, Field, Planned
from torch_dataloader_utils.transport import (
    Bundle,
    PackedBundle,
    pack,
    pack_planned,
)
from torch_dataloader_utils.transport.values import _Strings


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
    for batch, want in zip(held, expected, strict=True):
        assert_same_batch(batch, want)
    # ...and once dropped, the next unpack gives it back: the message after reuses it.
    del held, batch
    pack([converter.fields(batches[0])]).unpack()
    again = pack([converter.fields(rb) for rb in reversed(batches)])
    assert again.buffer.untyped_storage().data_ptr() == shared
    for got, rb in zip(again.unpack(), reversed(batches), strict=True):
        assert_same_batch(got, direct(converter, rb))


@pytest.mark.usefixtures("fresh")
def test_a_bundle_made_a_batch_at_a_time_keeps_its_buffer_until_its_last_batch() -> None:
    """`PackedBundle.each` makes each batch when it is asked for. Its buffer stays out of the
    pool until the last batch is made, even while no batch of it is held (a first batch of
    strings alone, then one dropped before the next is asked for) and other bundles are taken
    in between (each gives back the buffers nothing views any more)."""
    words = pa.array(["ab", "c", "déf"])
    fields = [
        [Field("s", words, None)],
        [Field("v", np.arange(6, dtype=np.int64), (2, 3)), Field("s", words.slice(1), None)],
        [Field("v", np.arange(3, dtype=np.int64), (3,))],
    ]
    bundle = pack(fields)
    shared = bundle.buffer.untyped_storage().data_ptr()
    batches = bundle.each()
    assert next(batches) == {"s": ["ab", "c", "déf"]}
    for _ in range(2):  # a bundle taken in: it gives back what is free, and takes a buffer
        other = pack(fields)
        assert other.buffer.untyped_storage().data_ptr() != shared
        other.unpack()
    second = next(batches)
    assert second["v"].tolist() == [[0, 1, 2], [3, 4, 5]] and second["s"] == ["c", "déf"]
    del second
    pack(fields).unpack()
    assert next(batches)["v"].tolist() == [0, 1, 2]
    assert next(batches, None) is None
    # Made to the end and nothing viewed: the buffer goes back, and the next bundle reuses it.
    pack(fields).unpack()
    assert pack(fields).buffer.untyped_storage().data_ptr() == shared


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


def test_planned_batches_are_written_in_their_places_and_cross_as_packed_ones() -> None:
    """`pack_planned`: each batch's writer gets its arrays' places in the shared buffer (flat,
    in the layout's order, every dtype aligned), and the batches unpack with the layout's
    keys, shapes and plain values, as `pack` would send the same arrays."""
    rng = np.random.default_rng(4)
    made = [
        {
            "ids": rng.integers(0, 9, (2, 3)).astype(np.int64),
            "n": 7 + i,
            "cuts": np.arange(i + 1, dtype=np.int32),
            "small": rng.integers(0, 9, (5,)).astype(np.int16),
        }
        for i in range(3)
    ]
    given: list[list[tuple[Any, int]]] = []

    def writer(arrays: list[np.ndarray]) -> Any:
        def write(places: list[np.ndarray]) -> None:
            given.append([(p.dtype, p.ndim) for p in places])
            for place, array in zip(places, arrays, strict=True):
                place[:] = array.reshape(-1)

        return write

    planned = [
        Planned(
            [(k, None, v) if isinstance(v, int) else (k, v.dtype, v.shape) for k, v in m.items()],
            writer([v for v in m.values() if not isinstance(v, int)]),
        )
        for m in made
    ]
    bundle = pack_planned(planned)
    kinds = [(np.dtype(np.int64), 1), (np.dtype(np.int32), 1), (np.dtype(np.int16), 1)]
    assert given == [kinds] * 3
    assert in_shared_memory(bundle.buffer)
    got = pickle.loads(ForkingPickler.dumps(bundle)).unpack()
    fields = [
        [Field(k, v, None if isinstance(v, int) else v.shape) for k, v in m.items()] for m in made
    ]
    for ours, theirs, want in zip(got, pack(fields).unpack(), made, strict=True):
        assert list(ours) == list(want) == list(theirs)
        for key, value in want.items():
            if isinstance(value, int):
                assert ours[key] == theirs[key] == value
            else:
                assert ours[key].tolist() == theirs[key].tolist() == value.tolist()
    assert pack_planned([]).unpack() == []


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


# --- strings and binary beside tensors in one bundle ------------------------------------------


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
    for fields in bundle.entries:
        for _, dtype, shape, where in fields:
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
        assert pinned.entries == bundle.entries
    unpacked = pinned.unpack()
    assert len(unpacked) == len(parts)
    for got, (c, rb, rows) in zip(unpacked, parts, strict=True):
        assert_same_batch(got, c(rb, rows))
        if error is None:
            assert all(v.is_pinned() for v in got.values() if isinstance(v, torch.Tensor))


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
