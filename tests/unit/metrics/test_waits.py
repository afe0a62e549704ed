"""`metrics.waits.Waits`: each batch's exposed wait, the loop's own time between batches
never counted, the pass's start and end counted in the total."""

from __future__ import annotations

import time

import pytest

from torch_dataloader_utils.metrics.waits import Waits


def _slow(pauses: list[float]):  # type: ignore[no-untyped-def]
    for i, pause in enumerate(pauses):
        time.sleep(pause)
        yield i
    time.sleep(0.03)  # (the pass's end)


def test_each_wait_is_the_time_in_next_not_the_loops() -> None:
    waits = Waits(epoch=3)
    for _ in waits.timed(_slow([0.02, 0.0, 0.04])):
        time.sleep(0.05)  # the loop's own work
    assert waits.batches == 3 and waits.epoch == 3
    each = list(waits.each)
    assert 0.02 <= each[0] < 0.045 and each[1] < 0.01 and 0.04 <= each[2] < 0.065
    assert waits.longest == pytest.approx(max(each), rel=1e-6)  # (stored as float32)
    assert 0.09 <= waits.total < 0.16  # (the end's 0.03 s too)
    assert list(waits.at) == sorted(waits.at)


def test_the_first_wait_counts_from_the_passs_start() -> None:
    started = time.perf_counter()
    time.sleep(0.03)  # (iter(loader): workers starting)
    waits = Waits(started=started)
    assert list(waits.timed(iter([1]))) == [1]
    assert waits.each[0] >= 0.03
