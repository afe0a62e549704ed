"""Buffers: a lent buffer goes back to its pool only when nothing views it; the pool works
without torch's private shared-storage constructor."""

from __future__ import annotations

import pickle
import threading
from multiprocessing.reduction import ForkingPickler
from typing import Any

import numpy as np
import pytest
import torch
import torch.multiprocessing  # registers torch's shared-memory reductions with ForkingPickler

from tests.unit.transport.test_wire import (  # noqa: F401  (fresh: a fixture)
    assert_same_batch,
    direct,
    fresh,
    record_batches,
)
from torch_dataloader_utils import transport
from torch_dataloader_utils.transport import (
    BufferPool,
    Lent,
    pack,
)

# --- lent buffers: given back to the pool only when no view of them is left ---------------------


def memory_of(tensor: torch.Tensor) -> int:
    """The address of the memory (a shared buffer, or a copy) a batch's tensor lies in."""
    return int(tensor.untyped_storage().data_ptr())


# What a program keeps of a batch's tensor, and how its values are read back.
HOLDERS: dict[str, tuple[Any, Any]] = {
    "the tensor": (lambda t: t, lambda h: h.numpy()),
    "a numpy array of it": (lambda t: t.numpy(), lambda h: h),
    "a slice of it": (lambda t: t[10:20], lambda h: h.numpy()),
    "a typed view of a slice": (
        lambda t: t.view(torch.uint8)[64:128].view(torch.int64),
        lambda h: h.numpy(),
    ),
    "the batch dict": (lambda t: {"id": t}, lambda h: h["id"].numpy()),
}


@pytest.mark.parametrize("holder", HOLDERS)
@pytest.mark.usefixtures("fresh")
def test_a_lent_buffer_is_reused_only_once_nothing_views_it(holder: str) -> None:
    hold, read = HOLDERS[holder]
    converter, batches = record_batches()
    first = pack([converter.fields(rb) for rb in batches])
    buffer = memory_of(first.buffer)
    unpacked = first.unpack()
    ids = unpacked[0]["id"]
    assert buffer <= ids.data_ptr() < buffer + first.buffer.numel()  # a view: no copy
    held = hold(ids)
    want = read(hold(ids.clone())).copy()
    del unpacked, ids
    for _ in range(3):  # each unpack settles the lent buffers: the first is still viewed
        again = pack([converter.fields(rb) for rb in reversed(batches)])
        assert memory_of(again.buffer) != buffer
        again.unpack()
    np.testing.assert_array_equal(read(held), want)  # nothing wrote into what is held
    del held
    pack([converter.fields(batches[0])]).unpack()  # settles: the first buffer goes back
    reused = pack([converter.fields(rb) for rb in batches])
    assert memory_of(reused.buffer) == buffer
    for got, rb in zip(reused.unpack(), batches, strict=True):
        assert_same_batch(got, direct(converter, rb))


def test_unpacking_without_a_use_count_keeps_held_batches_intact(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delattr(torch._C, "_storage_Use_Count")
    converter, batches = record_batches()
    held = [pack([converter.fields(rb)]).unpack()[0]["id"].numpy() for rb in batches]
    for _ in range(3):
        for rb in reversed(batches):
            pack([converter.fields(rb)]).unpack()
    for array, rb in zip(held, batches, strict=True):
        np.testing.assert_array_equal(array, rb.column("id").to_numpy())


@pytest.mark.usefixtures("fresh")
def test_without_a_use_count_batches_are_copied_and_the_buffer_released_at_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delattr(torch._C, "_storage_Use_Count")
    converter, batches = record_batches()
    first = pack([converter.fields(rb) for rb in batches])
    buffer = memory_of(first.buffer)
    held = first.unpack()
    assert all(
        memory_of(v) != buffer for b in held for v in b.values() if isinstance(v, torch.Tensor)
    )
    second = pack([converter.fields(rb) for rb in reversed(batches)])
    assert memory_of(second.buffer) == buffer  # released by the unpack itself
    second.unpack()
    for got, rb in zip(held, batches, strict=True):
        assert_same_batch(got, direct(converter, rb))


@pytest.mark.usefixtures("fresh")
def test_a_program_keeping_every_batch_keeps_them_intact_and_the_list_bounded() -> None:
    converter, batches = record_batches()
    kept = []
    for k in range(Lent.size + 10):
        rows = np.random.default_rng(k).permutation(64)
        kept.append((rows, pack([converter.fields(batches[0], rows)]).unpack()[0]))
    assert len(transport.buffers._lent._lent) <= Lent.size
    for rows, got in kept:
        assert_same_batch(got, converter(batches[0], rows))


def test_lending_from_two_threads_never_gives_back_a_viewed_buffer() -> None:
    converter, batches = record_batches()
    rounds = 60
    # Bundles made up front (packing runs in a worker, one thread), unpacked by two threads of
    # the main process at once (two loaders iterated in two threads).
    bundles = [
        [pack([converter.fields(rb) for rb in batches]) for _ in range(rounds)] for _ in range(2)
    ]
    errors: list[BaseException] = []

    def run(me: int) -> None:
        try:
            held = []
            for k, bundle in enumerate(bundles[me]):
                unpacked = bundle.unpack()
                if k % 3 == 0:
                    held.append(unpacked)
            for unpacked in held:
                for got, rb in zip(unpacked, batches, strict=True):
                    assert_same_batch(got, direct(converter, rb))
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(me,)) for me in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not errors, errors


# --- the buffer pool without torch's private shared-storage constructor -------------------------


def test_buffer_pool_without_new_shared_still_shares_and_round_trips(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(transport.memory, "_kind", "dev-shm")  # (a memfd needs no torch)
    owner = next(c for c in torch.UntypedStorage.__mro__ if "_new_shared" in vars(c))
    monkeypatch.delattr(owner, "_new_shared")
    assert not hasattr(torch.UntypedStorage, "_new_shared")
    pool = BufferPool()
    buffer = pool.take(1000).buffer
    assert buffer.is_shared() and buffer.dtype == torch.uint8 and buffer.numel() >= 1000
    monkeypatch.setattr(transport.buffers, "_pool", BufferPool())  # a pool with no buffers made yet
    converter, batches = record_batches()
    bundles = [pack([converter.fields(rb) for rb in batches]) for _ in range(2)]
    for bundle in bundles:
        assert bundle.buffer.is_shared()
        copy = pickle.loads(ForkingPickler.dumps(bundle))
        assert copy.buffer.is_shared()
        for got, rb in zip(copy.unpack(), batches, strict=True):
            assert_same_batch(got, direct(converter, rb))
    del copy, got
    pack([converter.fields(batches[0])]).unpack()  # gives back the buffers nothing views
    again = pack([converter.fields(batches[0])])  # released buffers are reused
    assert again.buffer.untyped_storage().data_ptr() in {
        b.buffer.untyped_storage().data_ptr() for b in bundles
    }
    assert_same_batch(again.unpack()[0], direct(converter, batches[0]))


# --- a pooled buffer's memory crosses once; later messages name it by its serial ----------------


@pytest.mark.usefixtures("fresh")
def test_a_pooled_buffer_crosses_with_its_first_message_then_by_its_serial() -> None:
    converter, batches = record_batches()
    first = pack([converter.fields(rb) for rb in batches])
    blob = ForkingPickler.dumps(first)
    assert b"DupFd" in bytes(blob)  # the buffer's file descriptor goes with the first message
    received = pickle.loads(blob)
    for got, rb in zip(received.unpack(), batches, strict=True):
        assert_same_batch(got, direct(converter, rb))
    del got
    pack([]).unpack()  # gives back the buffers nothing views
    second = pack([converter.fields(rb) for rb in reversed(batches)])
    assert second.serial == first.serial  # the same pooled buffer, reused
    blob = ForkingPickler.dumps(second)
    assert b"DupFd" not in bytes(blob)  # only its serial
    again = pickle.loads(blob)
    assert again.buffer is received.buffer  # the memory mapped with the first message
    for got, rb in zip(again.unpack(), reversed(batches), strict=True):
        assert_same_batch(got, direct(converter, rb))
    registry = transport.buffers._received
    assert (registry.carried, registry.named) == (1, 1)


def test_a_buffer_the_pool_drops_is_unmapped_by_the_main_process(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(transport.buffers, "_pool", BufferPool(size=2))
    monkeypatch.setattr(transport.buffers, "_lent", Lent())
    monkeypatch.setattr(transport.buffers, "_received", registry := transport.Received())
    converter, batches = record_batches()
    bundles = [pack([converter.fields(rb) for rb in batches]) for _ in range(3)]  # in flight
    assert [b.serial for b in bundles] == [0, 1, 2]
    assert [b.dropped for b in bundles] == [(), (), (0,)]  # the pool keeps 2
    copies = [pickle.loads(ForkingPickler.dumps(b)) for b in bundles]
    assert len(registry) == 2  # buffer 0 is let go (its batches keep their own reference)
    for copy in copies:
        for got, rb in zip(copy.unpack(), batches, strict=True):
            assert_same_batch(got, direct(converter, rb))


@pytest.mark.usefixtures("fresh")
def test_a_message_naming_a_buffer_never_received_is_a_clear_error() -> None:
    converter, batches = record_batches()
    bundle = pack([converter.fields(rb) for rb in batches])
    ForkingPickler.dumps(bundle)  # sent with its buffer, but that message is lost
    blob = ForkingPickler.dumps(bundle)  # a later message names the buffer only
    with pytest.raises(RuntimeError, match=r"worker process \d+ names its shared buffer 0"):
        pickle.loads(blob)


ROWS = 6_000


@pytest.mark.usefixtures("fresh")
@pytest.mark.timeout(120)
@pytest.mark.parametrize("persistent", [False, True], ids=["new-workers", "persistent"])
def test_real_workers_send_each_buffer_once_and_exited_workers_are_unmapped(
    tmp_path: Any, persistent: bool
) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    import torch_dataloader_utils as tdu

    path = tmp_path / "rows.parquet"
    ids = np.arange(ROWS)
    pq.write_table(pa.table({"id": ids, "x": ids * 0.5}), path, row_group_size=1_000)
    loader = tdu.create_dataloader(
        str(path),
        batch_size=50,
        num_workers=2,
        multiprocessing_context="fork",
        persistent_workers=persistent,
        bundle_rows=0,  # a message per batch: 60 per worker and epoch
    )
    registry = transport.buffers._received  # the main process's (this test's own)
    carried, named = registry.carried, registry.named
    epochs = 2
    for epoch in range(epochs):
        loader.set_epoch(epoch)
        seen: list[int] = []
        for batch in loader:
            seen.extend(batch["id"].tolist())
            assert torch.equal(batch["x"], batch["id"] * 0.5)
            assert len(registry) <= 2 * BufferPool().size  # never more than the pools hold
        assert sorted(seen) == list(range(ROWS))  # every row exactly once
        if not persistent:
            assert len(registry) == 0  # the workers exited: their buffers are unmapped
    carried, named = registry.carried - carried, registry.named - named
    worker_sets = 1 if persistent else epochs
    assert carried + named == epochs * ROWS // 50
    assert carried <= worker_sets * 2 * BufferPool().size
    if persistent:
        assert len(registry) == carried  # the live workers' buffers stay mapped
