"""Bundles: packed batches cross processes in one shared buffer and unpack to the same values."""

from __future__ import annotations

import itertools
import pickle
from multiprocessing.reduction import ForkingPickler
from typing import Any

import numpy as np
import pyarrow as pa
import torch
import torch.multiprocessing  # registers torch's shared-memory reductions with ForkingPickler

from tests.conftest import make_table
from torch_dataloader_utils.convert import Converter, Field, as_tensor
from torch_dataloader_utils.transport import Bundle, PackedBundle, pack, unbundle


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


def test_all_tensors_are_views_of_one_shared_buffer() -> None:
    converter, batches = record_batches()
    bundle = pack([converter.fields(rb) for rb in batches])
    assert isinstance(bundle.buffer, torch.Tensor)
    assert bundle.buffer.dtype == torch.uint8
    assert bundle.buffer.is_shared()
    base = bundle.buffer.untyped_storage().data_ptr()
    tensors = [v for b in bundle.unpack() for v in b.values() if isinstance(v, torch.Tensor)]
    assert tensors
    for t in tensors:
        assert t.untyped_storage().data_ptr() == base
        assert t.is_shared()
    # The views do not overlap: writing through one changes no other.
    nonempty = [t for t in tensors if t.numel()]
    spans = sorted((t.data_ptr(), t.data_ptr() + t.numel() * t.element_size()) for t in nonempty)
    assert all(a[1] <= b[0] for a, b in itertools.pairwise(spans))


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
    assert copy.buffer.is_shared()
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
    out = list(unbundle(iter(stream)))
    assert out[0] is plain
    assert out[1:3] == ["a", "b"]
    assert out[3]["v"].tolist() == [1, 2]
    assert out[4]["v"].tolist() == [3]
    assert out[5:] == ["c", 7]
    assert len(out) == 7
