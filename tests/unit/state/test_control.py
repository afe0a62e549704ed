"""`state.control.PassControl` in one process: the epoch rule's counters (ADR 0009). A pass after
one that delivered a batch reads the next epoch, ``set_epoch`` wins, and DataLoader workers
follow the pass the main process began for them (across processes: test_passes.py)."""

from __future__ import annotations

from torch_dataloader_utils.state.control import PassControl


def test_a_pass_after_one_that_delivered_a_batch_reads_the_next_epoch() -> None:
    control = PassControl()
    assert control.begin(for_workers=False) == (0, 1)
    assert control.begin(for_workers=False) == (0, 2)  # nothing delivered: the same epoch
    control.delivered()
    assert control.begin(for_workers=False) == (1, 3)
    assert (control.epoch, control.generation) == (1, 3)


def test_set_epoch_wins() -> None:
    control = PassControl()
    control.begin(for_workers=False)
    control.delivered()
    control.set_epoch(5)
    assert control.begin(for_workers=False)[0] == 5
    control.set_epoch(5, advance=True)
    assert control.begin(for_workers=False)[0] == 6


def test_workers_follow_the_main_process_or_go_on_from_their_own_last_pass() -> None:
    control = PassControl()
    control.begin(for_workers=True)
    assert control.begin_worker(0) is None and control.begin_worker(1) is None  # follow it
    # No new pass begun for them (a plain DataLoader's workers): each goes on from its own.
    assert [control.begin_worker(0), control.begin_worker(0), control.begin_worker(1)] == [0, 1, 0]
    assert control.begin_worker(1, epoch=7) == 7  # a loaded worker state wins
    assert control.begin_worker(1) == 8
    control.begin(for_workers=True)
    assert control.begin_worker(0) is None
