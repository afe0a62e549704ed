"""Arrow bundles: Arrow outputs cross processes as IPC streams in one shared buffer and come
back equal, zero-copy; what IPC would not give back as it was is pickled instead."""

from __future__ import annotations

import pickle
from multiprocessing.reduction import ForkingPickler
from typing import Any

import pyarrow as pa
import pytest
import torch.multiprocessing  # noqa: F401  (registers torch's shared-memory reductions)

from torch_dataloader_utils import transport
from torch_dataloader_utils.transport import ArrowBundle, Bundle, Unbundler, pack_arrow


@pytest.fixture(autouse=True)
def fresh(monkeypatch: pytest.MonkeyPatch) -> None:
    """A pool and lent buffers of this test's own."""
    monkeypatch.setattr(transport.buffers, "_pool", transport.BufferPool())
    monkeypatch.setattr(transport.buffers, "_lent", transport.Lent())
    monkeypatch.setattr(transport.buffers, "_received", transport.Received())


UUID = pa.binary(16)


def outputs() -> list[Any]:
    """Record batches and tables of every kind Arrow output passes on: sliced, empty, with
    metadata, and a table whose parts have different dictionaries."""
    words = pa.array(["a", None, "b", "a"]).dictionary_encode()
    rb = pa.record_batch(
        {
            "id": pa.array([1, 2, 3, 4]),
            "s": pa.array(["x", None, "zz", ""]),
            "lists": pa.array([[1], None, [], [2, 3]], pa.list_(pa.int32())),
            "st": pa.array([{"a": 1}, None, {"a": 3}, {"a": None}]),
            "words": words,
            "none": pa.nulls(4),
            "uuid": pa.ExtensionArray.from_storage(pa.uuid(), pa.array([b"0" * 16] * 4, UUID)),
        },
        metadata={"k": "v"},
    )
    other = pa.record_batch({"words": pa.array(["q", "r"]).dictionary_encode()})
    table = pa.Table.from_batches([pa.record_batch({"words": words}), other])
    return [rb, rb.slice(1, 2), rb.slice(4, 0), table, pa.table({"x": pa.array([], pa.int8())})]


def sent(bundle: Any) -> Any:
    return pickle.loads(ForkingPickler.dumps(bundle))


def test_outputs_come_back_equal_in_the_shared_buffer() -> None:
    originals = outputs()
    bundle = pack_arrow(originals)
    assert isinstance(bundle, ArrowBundle) and bundle.pooled
    received = sent(bundle)
    got = Unbundler()(received)
    assert [type(o) for o in got] == [type(o) for o in originals]
    for output, original in zip(got, originals, strict=True):
        assert output.equals(original)
        assert output.schema.metadata == original.schema.metadata
    start = received.buffer.data_ptr()
    address = got[0].column("s").buffers()[2].address
    assert start <= address < start + received.buffer.numel()  # no copy


def test_a_buffer_goes_back_only_once_nothing_read_from_it_is_left() -> None:
    first = pack_arrow(outputs()[:1])
    assert isinstance(first, ArrowBundle)
    kept = sent(first).unpack()[0].column("s")  # a column outlives its batch
    pack_arrow(outputs()[:1]).unpack()  # (settles: the first buffer is still viewed)
    second = pack_arrow(outputs()[:1])
    assert isinstance(second, ArrowBundle) and second.serial != first.serial
    del kept
    second.unpack()  # its buffer, and the first one, go back now
    third = pack_arrow(outputs()[:1])
    assert isinstance(third, ArrowBundle) and third.serial == first.serial


class _Python(pa.ExtensionType):
    def __init__(self) -> None:
        super().__init__(pa.int64(), "tests.python-extension")

    def __arrow_ext_serialize__(self) -> bytes:
        return b""

    @classmethod
    def __arrow_ext_deserialize__(cls, storage_type: pa.DataType, serialized: bytes) -> _Python:
        return cls()


def test_python_extension_types_and_other_outputs_are_pickled() -> None:
    storage = pa.array([1, 2])
    array = pa.ExtensionArray.from_storage(_Python(), storage)
    nested = pa.StructArray.from_arrays([array], ["inner"])
    for item in (pa.record_batch({"e": array}), pa.record_batch({"n": nested}), {"id": [1]}):
        bundle = pack_arrow([item])
        assert isinstance(bundle, Bundle)
        got = Unbundler()(sent(bundle))
        assert got == [item] if isinstance(item, dict) else got[0].equals(item)


def test_without_room_in_shared_memory_a_private_buffer_goes_as_bytes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(transport.buffers._pool, "take", lambda nbytes: None)
    originals = outputs()
    bundle = pack_arrow(originals)
    assert isinstance(bundle, ArrowBundle) and not bundle.pooled
    received = sent(bundle)
    assert not received.pooled
    for output, original in zip(received.unpack(), originals, strict=True):
        assert output.equals(original)
