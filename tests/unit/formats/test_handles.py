"""`formats.handles.HandleCache` beyond its fork behaviour (tested in test_parquet.py):
forgetting one handle, and pickling without handles."""

from __future__ import annotations

import pickle

from torch_dataloader_utils.formats.handles import HandleCache


def test_forget_closes_one_handle_and_the_next_get_opens_it_again() -> None:
    closed: list[str] = []
    cache: HandleCache[str, str] = HandleCache(2, closed.append)
    assert cache.get("a", lambda: "a1") == "a1"
    assert cache.get("b", lambda: "b1") == "b1"
    cache.forget("a")
    cache.forget("missing")  # nothing held: nothing to do
    assert closed == ["a1"] and len(cache) == 1
    assert cache.get("a", lambda: "a2") == "a2"
    cache.clear()
    assert sorted(closed) == ["a1", "a2", "b1"] and len(cache) == 0


def test_a_pickled_cache_holds_no_handle_and_keeps_its_capacity() -> None:
    cache: HandleCache[str, int] = HandleCache(1)  # facts: nothing to close
    cache.get("a", lambda: 1)
    clone = pickle.loads(pickle.dumps(cache))
    assert len(clone) == 0 and len(cache) == 1
    clone.get("a", lambda: 2)
    assert clone.get("b", lambda: 3) == 3 and len(clone) == 1  # capacity 1: "a" evicted
