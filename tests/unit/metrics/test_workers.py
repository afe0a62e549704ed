"""`metrics.workers`: ``num_workers="auto"``'s choice from the cores, the ranks on the
machine and a measurement of the batches, each with its reason."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
import torch

from torch_dataloader_utils.metrics.workers import MAX_WORKERS, choose_workers, cores_per_rank


def _batches(seconds: float, rows: int, n: int = 20) -> Iterator[dict[str, torch.Tensor]]:
    for _ in range(n):
        if seconds:  # (sleep(0) yields the core: on a loaded machine, for milliseconds)
            time.sleep(seconds)
        yield {"x": torch.zeros(rows, 8)}


def test_one_core_a_rank_reads_in_process() -> None:
    count, why = choose_workers(_batches(0.01, 10), cores=8, local=8)
    assert count == 0 and "one core a rank" in why


def test_without_a_measurement_each_core_gets_a_worker() -> None:
    assert choose_workers(None, cores=4, local=1)[0] == 4
    assert choose_workers(None, cores=64, local=2)[0] == MAX_WORKERS


def test_batches_cheaper_than_their_crossing_stay_in_process() -> None:
    count, why = choose_workers(_batches(0.0, 4), cores=4, local=1)
    assert count == 0 and "would not pay" in why


def test_batches_dearer_than_their_crossing_get_a_worker_a_core() -> None:
    count, why = choose_workers(_batches(0.005, 1024), cores=6, local=2)
    assert count == 3 and "ms to make" in why


def test_the_first_blocks_reading_counts_in_a_batchs_cost() -> None:
    """The first batch waits for the first block (read once, then batches made from it
    cheaply): workers would read it too, so it counts, spread over the batches measured."""

    def reading_first() -> Iterator[dict[str, torch.Tensor]]:
        time.sleep(0.03)
        for _ in range(20):
            yield {"x": torch.zeros(4)}

    count, why = choose_workers(reading_first(), cores=2, local=1)
    assert count == 2 and "ms to make" in why, why


def test_too_few_batches_decide_from_the_cores() -> None:
    assert choose_workers(iter([{"x": torch.zeros(1)}]), cores=2, local=1)[0] == 2


def test_the_ranks_here_come_from_local_world_size(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "4")
    assert cores_per_rank()[1] == 4
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "x")
    assert cores_per_rank()[1] == 1
