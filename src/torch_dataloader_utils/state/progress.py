"""Where the pass being read in one process stands (`Progress`)."""

from __future__ import annotations

from dataclasses import dataclass

from ..planning import Pass, Topology

__all__ = ["Progress", "before_leg"]


@dataclass
class Progress:
    """The pass being read in this process: where it started, its batches, what was delivered.

    Attributes:
        pass_: the pass.
        start: batches delivered before this pass began reading (a resume), counted from
            the start of its leg (the epoch's, unless an elastic resume began another).
        total: batches of the pass, from the start of its leg.
        topology: whose batches these are (the rank's, or one worker's stream).
        delivered: batches delivered in this pass.
    """

    pass_: Pass
    start: int
    total: int
    topology: Topology
    delivered: int = 0

    @property
    def batches(self) -> int:
        """Batches delivered in the leg so far (before and in this pass)."""
        return self.start + self.delivered

    @property
    def complete(self) -> bool:
        """Whether every batch of the epoch (of its last leg) was delivered."""
        return self.batches >= self.total


def before_leg(pass_: Pass) -> int:
    """Batches each rank delivered of ``pass_``'s epoch before its current leg (the legs
    of its elastic resumes)."""
    return sum(leg.batches for leg in pass_.legs)
