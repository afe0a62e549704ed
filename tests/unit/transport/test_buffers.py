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
    assert len(transport.wire._lent._lent) <= Lent.size
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
    owner = next(c for c in torch.UntypedStorage.__mro__ if "_new_shared" in vars(c))
    monkeypatch.delattr(owner, "_new_shared")
    assert not hasattr(torch.UntypedStorage, "_new_shared")
    pool = BufferPool()
    buffer = pool.take(1000)
    assert buffer.is_shared() and buffer.dtype == torch.uint8 and buffer.numel() >= 1000
    monkeypatch.setattr(transport.wire, "_pool", BufferPool())  # a pool with no buffers made yet
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
