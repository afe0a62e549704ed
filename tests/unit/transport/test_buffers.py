"""Buffers: the landing reuses only regions nothing views; the pool works without torch's
private shared-storage constructor."""

from __future__ import annotations

import pickle
import threading
from multiprocessing.reduction import ForkingPickler
from typing import Any

import numpy as np
import pytest
import torch
import torch.multiprocessing  # registers torch's shared-memory reductions with ForkingPickler

from tests.unit.transport.test_wire import assert_same_batch, direct, record_batches
from torch_dataloader_utils import transport
from torch_dataloader_utils.transport import (
    BufferPool,
    Landing,
    pack,
)

# --- the landing: private regions reused only when nothing views them --------------------------


def region_of(tensor: torch.Tensor) -> int:
    """The address of the region (storage) a landing view lies in."""
    return int(tensor.untyped_storage().data_ptr())


HOLDERS: dict[str, Any] = {
    "the view": lambda v: v,
    "a numpy array of the view": lambda v: v.numpy(),
    "a slice of the view": lambda v: v[10:20],
    "a typed view of a slice": lambda v: v[64:128].view(torch.int64),
}


@pytest.mark.parametrize("holder", HOLDERS)
def test_landing_region_is_not_reused_while_anything_views_it(holder: str) -> None:
    landing = Landing()
    first = landing.take(1000)
    assert first.numel() == 1000 and first.dtype == torch.uint8
    assert first.untyped_storage().nbytes() >= 1000
    assert first._base is not None  # a view: it alone marks the region in use
    region = region_of(first)
    held = HOLDERS[holder](first)
    del first
    other = landing.take(1000)
    assert region_of(other) != region  # something still views the first region
    del other, held
    again = landing.take(1000)
    assert region_of(again) == region  # every view dropped: the region is reused


def test_landing_hands_out_distinct_regions_while_views_are_held() -> None:
    landing = Landing()
    held = []
    for k in range(8):  # more than the landing keeps
        view = landing.take(512)
        view.fill_(k)
        held.append(view)
    assert len({region_of(v) for v in held}) == len(held)
    for k, view in enumerate(held):
        assert bool((view == k).all()), k


def test_landing_without_a_use_count_never_reuses_a_region(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delattr(torch._C, "_storage_Use_Count")
    landing = Landing()
    held = []
    for k in range(6):
        view = landing.take(256)
        view.fill_(k + 1)
        held.append(view.numpy())  # only an array of the view is kept: no count can see it
        del view
    assert len({a.ctypes.data for a in held}) == len(held)  # never the same region twice
    for k, array in enumerate(held):
        assert (array == k + 1).all(), k  # nothing held was overwritten


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


def test_landing_take_from_two_threads_never_shares_a_region() -> None:
    landing = Landing()
    landing.take(4096)  # one free region: both threads look at it first
    rounds = 300
    barrier = threading.Barrier(2, timeout=30)
    regions: list[list[int]] = [[], []]
    errors: list[BaseException] = []

    def run(me: int) -> None:
        try:
            for _ in range(rounds):
                barrier.wait()
                view = landing.take(4096)  # both threads take at once
                view.fill_(me)
                regions[me].append(region_of(view))
                barrier.wait()  # both views are alive here
                assert bool((view == me).all()), "the other thread wrote into my region"
                barrier.wait()
                del view  # both dropped: the next round may reuse the regions
        except BaseException as exc:
            errors.append(exc)
            barrier.abort()

    threads = [threading.Thread(target=run, args=(me,)) for me in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not errors, errors
    assert len(regions[0]) == len(regions[1]) == rounds
    assert all(a != b for a, b in zip(regions[0], regions[1], strict=True))
    assert len(set(regions[0]) | set(regions[1])) <= landing.size  # and regions were reused


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
    again = pack([converter.fields(batches[0])])  # released buffers are reused
    assert again.buffer.untyped_storage().data_ptr() in {
        b.buffer.untyped_storage().data_ptr() for b in bundles
    }
    assert_same_batch(again.unpack()[0], direct(converter, batches[0]))
