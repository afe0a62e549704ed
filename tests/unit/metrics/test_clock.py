"""`metrics.clock.StageClock`: seconds and batches per process, in shared memory (a spawned
process's records are seen here), nested stages counted once."""

from __future__ import annotations

import time

import torch.multiprocessing as mp

from torch_dataloader_utils.metrics.clock import BATCHES, MAKE, READ, STAGES, StageClock


def _slow(n: int, pause: float):  # type: ignore[no-untyped-def]
    for i in range(n):
        time.sleep(pause)
        yield i


def test_timed_counts_each_items_time_and_the_batches() -> None:
    clock = StageClock()
    assert list(clock.timed(_slow(3, 0.02), READ, counts=True)) == [0, 1, 2]
    seconds = clock.seconds()
    assert seconds.shape == (257, len(STAGES) + 1)
    assert 0.06 <= seconds[0, READ] < 0.5
    assert seconds[0, BATCHES] == 3
    assert seconds[1:].sum() == 0  # (the main process's slot only)


def test_timed_less_counts_the_nested_stage_once() -> None:
    clock = StageClock()

    def made():  # type: ignore[no-untyped-def]
        for item in clock.timed(_slow(3, 0.03), READ):
            time.sleep(0.01)  # the making, outside the reading
            yield item

    assert list(clock.timed_less(made(), MAKE, (READ,))) == [0, 1, 2]
    seconds = clock.seconds()
    assert 0.09 <= seconds[0, READ] < 0.5
    assert 0.03 <= seconds[0, MAKE] < 0.08  # (the reading left out)


def _child(clock: StageClock) -> None:
    clock.add(MAKE, 1.5, batches=2)


def test_a_spawned_process_records_into_the_same_memory() -> None:
    clock = StageClock()
    process = mp.get_context("spawn").Process(target=_child, args=(clock,))
    process.start()
    process.join(60)
    assert process.exitcode == 0
    assert clock.seconds()[0, MAKE] == 1.5 and clock.seconds()[0, BATCHES] == 2
