"""Where a pass stands in one process (`state.progress`): batches counted from the start of its
leg, complete once they reach the leg's total."""

from __future__ import annotations

from torch_dataloader_utils.planning import Layout, Leg, Pass, Topology
from torch_dataloader_utils.state.progress import Progress, before_leg


def test_batches_count_from_the_start_of_the_leg() -> None:
    progress = Progress(Pass(epoch=0, batches=3), start=3, total=5, topology=Topology())
    assert progress.batches == 3 and not progress.complete
    progress.delivered += 2
    assert progress.batches == 5 and progress.complete


def test_the_batches_before_a_leg_are_those_of_the_earlier_legs() -> None:
    layout = Layout(4, False, 0, False, "drop", block_rows=64, first_block_rows=8)
    legs = (Leg(2, 1, layout, batches=7), Leg(4, 2, layout, batches=5))
    assert before_leg(Pass(epoch=1, legs=legs, batches=2)) == 12
    assert before_leg(Pass(epoch=1)) == 0
