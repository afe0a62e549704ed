"""Bundles sized from /dev/shm's room (`transport.memory.bundle_bytes`): whole grains of a
worker's share, never below one grain (no buffer is smaller), and a log line that says so."""

from __future__ import annotations

import logging

import pytest

from torch_dataloader_utils.transport import memory
from torch_dataloader_utils.transport.memory import BUNDLE_BYTES, POOL_BUFFERS, POOL_GRAIN

MIB = 2**20


@pytest.fixture
def room(monkeypatch: pytest.MonkeyPatch) -> list[tuple[int, int]]:
    """/dev/shm's (size, free), as the test sets it; buffers in /dev/shm, nothing logged yet."""
    given = [(64 * MIB, 64 * MIB)]
    monkeypatch.setattr(memory, "dev_shm_room", lambda: given[0])
    monkeypatch.setattr(memory, "_kind", "dev-shm")
    monkeypatch.setattr(memory, "_logged", set())
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    return given


def test_a_small_room_shrinks_bundles_to_a_grain_and_says_so(
    room: list[tuple[int, int]], caplog: pytest.LogCaptureFixture
) -> None:
    # The case: 23.9 MiB free, 2 workers: a share of just under a grain each.
    room[0] = (24 * MIB, int(23.9 * MIB))
    with caplog.at_level(logging.INFO, logger=memory.__name__):
        fits = memory.bundle_bytes(2)
    assert 0 < fits < POOL_GRAIN  # a bundle fills the one grain its buffer takes anyway
    (line,) = [r.getMessage() for r in caplog.records if "shrunk" in r.getMessage()]
    assert "has 23.9 MiB free of 24.0 MiB: bundles shrunk from 16.0 MiB to 960 KiB" in line
    assert "0.0 MiB" not in line


def test_a_bundles_buffer_keeps_to_its_share_of_the_room(room: list[tuple[int, int]]) -> None:
    for free_mib in (1, 8, 23.9, 24, 41.9, 64, 100, 250, 1000):
        for workers in (1, 2, 4, 8):
            room[0] = (1024 * MIB, int(free_mib * MIB))
            fits = memory.bundle_bytes(workers, tell=False)
            share = int(room[0][1] * 0.5) // (workers * POOL_BUFFERS)
            buffer = -(-(fits + 64) // POOL_GRAIN) * POOL_GRAIN  # header, rounded to grains
            assert fits == BUNDLE_BYTES or buffer <= max(share, POOL_GRAIN), (free_mib, workers)
            # Never below the grain a buffer takes anyway (less its header's slack).
            assert fits >= POOL_GRAIN - memory._BUFFER_SLACK, (free_mib, workers)


@pytest.mark.parametrize(
    ("nbytes", "text"),
    [(0, "0 KiB"), (40 * 1024, "40 KiB"), (960 * 1024, "960 KiB"), (MIB, "1.0 MiB")],
)
def test_sizes_in_log_lines_are_never_a_zero_that_is_not(nbytes: int, text: str) -> None:
    assert memory._mib(nbytes) == text
