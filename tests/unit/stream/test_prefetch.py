"""``Prefetcher``: a bounded read-ahead thread that delivers in order, fails loudly, and stops."""

from __future__ import annotations

import itertools
import threading
import time
import uuid
from collections.abc import Iterator

import pytest

from torch_dataloader_utils.stream.prefetch import Prefetcher

WAIT = 10.0  # seconds: a bound on every wait, so a broken stop fails instead of hanging


def threads_named(name: str) -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == name]


def unique_name() -> str:
    return f"test-prefetch-{uuid.uuid4().hex[:8]}"


def wait_until_gone(name: str) -> bool:
    deadline = time.monotonic() + WAIT
    while time.monotonic() < deadline:
        threads = threads_named(name)
        if not threads:
            return True
        threads[0].join(timeout=0.05)
    return not threads_named(name)


def close_within(closer, timeout: float = WAIT) -> None:
    """Run ``closer`` in a helper thread; fail if it does not return in ``timeout`` seconds."""
    helper = threading.Thread(target=closer, daemon=True)
    helper.start()
    helper.join(timeout)
    assert not helper.is_alive(), "closing the prefetcher did not return"


@pytest.mark.timeout(30)
@pytest.mark.parametrize("depth", [1, 2, 8])
def test_yields_every_item_in_order(depth: int) -> None:
    items = [(i, object()) for i in range(500)]
    assert list(Prefetcher(iter(items), depth=depth)) == items
    assert list(Prefetcher([], depth=depth)) == []


@pytest.mark.timeout(30)
def test_runs_the_source_in_another_thread() -> None:
    name = unique_name()
    seen: list[str] = []

    def source() -> Iterator[int]:
        seen.append(threading.current_thread().name)
        yield 1

    assert list(Prefetcher(source(), name=name)) == [1]
    assert seen == [name]


@pytest.mark.timeout(30)
def test_source_exception_is_reraised_in_the_consumer() -> None:
    class SourceError(RuntimeError):
        pass

    error = SourceError("boom at item 5")

    def source() -> Iterator[int]:
        yield from range(5)
        raise error

    name = unique_name()
    got: list[int] = []
    with pytest.raises(SourceError, match="boom at item 5") as info:
        for item in Prefetcher(source(), depth=2, name=name):
            got.append(item)
    assert info.value is error  # the same exception, with its traceback
    assert got == [0, 1, 2, 3, 4]  # delivered where the failed item would have arrived
    assert wait_until_gone(name)


@pytest.mark.timeout(30)
def test_consumer_stopping_early_stops_the_thread() -> None:
    name = unique_name()
    pulled = itertools.count()

    def endless() -> Iterator[int]:
        for i in itertools.count():
            next(pulled)
            yield i

    it = iter(Prefetcher(endless(), depth=2, name=name))
    assert [next(it) for _ in range(3)] == [0, 1, 2]
    assert threads_named(name), "the thread should be running while items are pending"
    close_within(it.close)  # what a for-loop's break + garbage collection does
    assert not threads_named(name)
    # Nothing more is read once stopped.
    before = next(pulled)
    time.sleep(0.2)
    assert next(pulled) == before + 1


@pytest.mark.timeout(30)
def test_no_thread_until_iterated_and_close_without_iterating_is_fine() -> None:
    name = unique_name()
    prefetcher = Prefetcher(itertools.count(), depth=3, name=name)
    assert not threads_named(name)  # a Prefetcher never iterated holds no thread
    close_within(prefetcher.close)
    assert not threads_named(name)
    started = Prefetcher(iter(range(5)), depth=1, name=name)
    assert list(started) == list(range(5))
    assert not threads_named(name)


@pytest.mark.timeout(30)
def test_break_out_of_a_for_loop_stops_the_thread() -> None:
    name = unique_name()

    def consume() -> None:
        for item in Prefetcher(itertools.count(), depth=1, name=name):
            if item == 10:
                break

    close_within(consume)
    assert wait_until_gone(name)


@pytest.mark.timeout(30)
def test_read_ahead_is_bounded() -> None:
    depth = 3
    pulled: list[int] = []

    def source() -> Iterator[int]:
        for i in range(1000):
            pulled.append(i)
            yield i

    it = iter(Prefetcher(source(), depth=depth))
    for taken in (1, 2):
        assert next(it) == taken - 1
        time.sleep(0.3)  # give the thread every chance to run ahead
        # The items taken, and ``depth`` more made ahead of them (queued or being made): the
        # thread does not start an item while ``depth`` wait.
        assert len(pulled) <= taken + depth
    it.close()


@pytest.mark.timeout(30)
def test_at_exit_the_threads_left_running_are_stopped() -> None:
    from torch_dataloader_utils.stream import prefetch

    name = unique_name()
    busy = threading.Event()

    def slow() -> Iterator[int]:
        for i in itertools.count():
            busy.set()
            time.sleep(0.05)  # the thread is making an item when the program ends
            yield i

    it = iter(Prefetcher(slow(), depth=1, name=name))
    assert next(it) == 0  # left unfinished, as by a loop left with break
    assert busy.wait(WAIT) and threads_named(name)
    close_within(prefetch._stop_running)  # what atexit calls
    assert not threads_named(name)


EXIT_SCRIPT = """
import sys
import torch_dataloader_utils as tdu

loader = tdu.create_dataloader(sys.argv[1], shuffle=True, num_workers=0, batch_size=16)
ids = next(iter(loader))["id"].tolist()
# The first batch: 16 distinct rows of the data (the epoch is left unfinished on purpose).
print(len(set(ids)) == 16 and all(0 <= i < 30000 for i in ids))
"""


@pytest.mark.timeout(120)
def test_a_script_that_ends_mid_epoch_exits_cleanly(tmp_path) -> None:
    # The first block is small and the next is being read when the script ends. Before the
    # exit hook, 1 in 7-10 such runs aborted (exit status 134, "terminate called without an
    # active exception"); three runs at once make a regression likely to show.
    import subprocess
    import sys

    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    data = tmp_path / "data"
    data.mkdir()
    for i in range(1500):
        ids = np.arange(i * 20, (i + 1) * 20, dtype=np.int64)
        pq.write_table(pa.table({"id": ids}), data / f"part-{i:05d}.parquet")
    runs = [
        subprocess.Popen(
            [sys.executable, "-X", "faulthandler", "-c", EXIT_SCRIPT, str(data)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(3)
    ]
    for run in runs:
        out, err = run.communicate(timeout=100)
        assert run.returncode == 0, err[-2000:]
        assert out.strip() == "True"
