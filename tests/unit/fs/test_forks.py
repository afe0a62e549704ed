"""`fs.forks.ProcessLocal`, the one fork-safety mechanism: real forked children (multiprocessing's
``fork``), never a faked pid."""

from __future__ import annotations

import multiprocessing
import os
import pickle
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest

from torch_dataloader_utils.errors import InvalidArgumentError
from torch_dataloader_utils.fs import forks
from torch_dataloader_utils.fs import spec as spec_module
from torch_dataloader_utils.fs.forks import ProcessLocal
from torch_dataloader_utils.fs.retry import RetryCounter

FORK = multiprocessing.get_context("fork")


class Resource:
    """A value that says which process built it, and whether anyone closed it."""

    def __init__(self) -> None:
        self.pid = os.getpid()
        self.closed = False


def in_child(target: Callable[[], Any], timeout: float = 30) -> Any:
    """``target()`` run in a forked child; what it returned (or raised, re-raised here)."""
    queue = FORK.SimpleQueue()

    def run() -> None:
        try:
            queue.put(("ok", target()))
        except BaseException as exc:
            queue.put(("error", repr(exc)))

    child = FORK.Process(target=run)
    child.start()
    child.join(timeout)
    if child.is_alive():
        child.kill()
        child.join()
        raise AssertionError(f"the child hung for {timeout} s")
    assert child.exitcode == 0 and not queue.empty(), child.exitcode
    kind, value = queue.get()
    if kind == "error":
        raise AssertionError(f"the child raised {value}")
    return value


def test_a_forked_child_builds_its_own_and_keeps_its_parents_unclosed() -> None:
    holder = ProcessLocal(Resource)
    parents = holder.get()
    assert holder.get() is parents and not holder.inherited

    def child() -> tuple[bool, int, bool, bool, bool]:
        assert holder.peek() is None  # set aside at the fork, before any code ran
        own = holder.get()
        kept = any(parents in group for group in forks._inherited)
        return own is parents, own.pid, holder.inherited, kept, parents.closed

    same, pid, inherited, kept, closed = in_child(child)
    assert not same and pid != os.getpid()  # built in the child
    assert inherited and kept and not closed  # the parent's: referenced, never closed
    assert holder.get() is parents and not holder.inherited  # the parent's is untouched


def test_a_lock_held_by_a_parents_thread_at_the_fork_is_not_held_in_the_child() -> None:
    parent = os.getpid()
    building = threading.Event()
    release = threading.Event()

    def slow() -> Resource:
        if os.getpid() == parent:  # the parent's build holds the lock until released
            building.set()
            release.wait(30)
        return Resource()

    holder = ProcessLocal(slow)
    thread = threading.Thread(target=holder.get)
    thread.start()
    assert building.wait(10)
    try:
        assert in_child(lambda: holder.get().pid) != parent
    finally:
        release.set()
        thread.join(10)
    assert holder.get().pid == parent


def test_a_retry_counter_counts_in_a_child_forked_while_its_lock_was_held() -> None:
    counter = RetryCounter()
    with counter._lock.get():  # held by this thread at the fork
        in_child(lambda: counter.add(3))
    assert counter.total == 3  # shared memory: the child's count is seen here


def test_inherited_passes_to_grandchildren() -> None:
    holder = ProcessLocal(Resource)
    holder.get()

    def grandchild() -> bool:
        return holder.inherited

    def child() -> tuple[bool, bool]:
        return holder.inherited, in_child(grandchild)  # the child built nothing

    assert in_child(child) == (True, True)


def test_the_native_azure_filesystem_is_refused_in_a_forked_child(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(spec_module, "_native_azure", ProcessLocal(lambda: True))
    spec_module._claim_native_azure()  # no Azure needed: the claim is what is checked
    spec_module._claim_native_azure()  # the same process may build more

    def child() -> str:
        with pytest.raises(InvalidArgumentError, match="spawn") as caught:
            spec_module._claim_native_azure()
        return str(caught.value)

    assert "connection pool is shared with the parent" in in_child(child)


def test_a_pickled_or_copied_holder_has_no_value() -> None:
    holder: ProcessLocal[list[int]] = ProcessLocal(list)
    holder.get().append(1)
    clone = pickle.loads(pickle.dumps(holder))
    assert clone.peek() is None and clone.get() == [] and holder.get() == [1]


def test_threads_build_one_value() -> None:
    calls: list[int] = []

    def slow() -> Resource:
        calls.append(1)
        time.sleep(0.05)
        return Resource()

    holder = ProcessLocal(slow)
    seen: list[Resource] = []
    threads = [threading.Thread(target=lambda: seen.append(holder.get())) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(10)
    assert len(calls) == 1 and len({id(r) for r in seen}) == 1


def test_pop_forgets_and_peek_builds_nothing() -> None:
    holder = ProcessLocal(Resource)
    assert holder.peek() is None and holder.pop() is None
    built = holder.get()
    assert holder.peek() is built and holder.pop() is built
    assert holder.peek() is None and holder.get() is not built
