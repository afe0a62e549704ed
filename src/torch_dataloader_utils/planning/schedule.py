"""A mixture's weights on a schedule (pure): the weights of each phase, and the rows each source
delivers in and before an epoch (ADR 0023).

``weights_schedule=[(0, [3, 1]), (50_000, [1, 1])]``: from step 50,000 (a batch of every rank,
counted from epoch 0's first batch) the weights are 1:1. Steps count batches of the world size
the schedule was first read with (`Pass.steps`): a change is then at a number of
*tiled turns* of its epoch (`phases.Tiling.before`), the same on any later topology. Each
phase's turns are split among the sources by its weights (`mixture.quotas`), so what a source
delivers in an epoch, and before it, depends on the schedule and the epoch alone: each source
goes on where it stopped, phase after phase, epoch after epoch.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..errors import InvalidArgumentError

__all__ = ["EpochPhases", "Schedule"]


@dataclass(frozen=True)
class Schedule:
    """Weights from given steps on.

    Attributes:
        steps: the step each phase begins at (the first 0; increasing).
        weights: each phase's weight of each source.
    """

    steps: tuple[int, ...]
    weights: tuple[tuple[float, ...], ...]

    @classmethod
    def of(cls, given: Any, sources: int) -> Schedule:
        """The schedule ``given`` as ``[(step, [w_0, ..., w_k-1]), ...]``.

        Raises:
            InvalidArgumentError: not a list of (step, weights) pairs, steps not increasing
                from 0, or weights not one per source, finite, >= 0 and not all 0.
        """
        try:
            pairs = [(step, list(weights)) for step, weights in given]
        except (TypeError, ValueError):
            raise InvalidArgumentError(
                "weights_schedule must be a list of (step, [weight of each source]) pairs, "
                f"got {given!r}"
            ) from None
        if not pairs or pairs[0][0] != 0:
            raise InvalidArgumentError(
                "weights_schedule must begin at step 0 (the weights the run starts with), "
                f"got {given!r}"
            )
        steps = [s for s, _ in pairs]
        if not all(isinstance(s, int) and not isinstance(s, bool) for s in steps) or any(
            b <= a for a, b in itertools.pairwise(steps)
        ):
            raise InvalidArgumentError(
                f"weights_schedule's steps must be increasing integers, got {steps}"
            )
        for step, weights in pairs:
            if len(weights) != sources:
                raise InvalidArgumentError(
                    f"weights_schedule at step {step} gives {len(weights)} weights for "
                    f"{sources} sources"
                )
            w = np.asarray(weights, dtype=np.float64)
            if not np.all(np.isfinite(w)) or np.any(w < 0) or not np.any(w > 0):
                raise InvalidArgumentError(
                    f"weights_schedule at step {step}: weights must be finite, >= 0 and not "
                    f"all 0, got {weights}"
                )
        return cls(tuple(steps), tuple(tuple(float(x) for x in w) for _, w in pairs))

    def phase_at(self, step: int) -> int:
        """The phase in force at ``step``."""
        return int(np.searchsorted(np.asarray(self.steps), step, side="right")) - 1

    def identity(self) -> list[Any]:
        """The schedule as plain values (a plan's identity)."""
        return [[s, list(w)] for s, w in zip(self.steps, self.weights, strict=True)]


Split = Callable[[int, int], list[int]]  # (phase, turns) -> each source's turns


@dataclass(frozen=True)
class EpochPhases:
    """An epoch's phases under a schedule.

    Attributes:
        bounds: tiled turns of the epoch where each phase after its first begins.
        counts: positions of each source in each phase (whole turns).
        offsets: positions of each source's sequence delivered before the epoch.
    """

    bounds: tuple[int, ...]
    counts: tuple[tuple[int, ...], ...]
    offsets: tuple[int, ...]

    @property
    def quotas(self) -> tuple[int, ...]:
        """Positions of each source the epoch delivers."""
        return tuple(int(x) for x in np.asarray(self.counts, np.int64).sum(axis=0))

    @classmethod
    def of(
        cls,
        schedule: Schedule,
        epoch: int,
        *,
        total: int,
        steps: int,
        before: Callable[[int], int],
        split: Split,
        turn: int,
    ) -> EpochPhases:
        """Epoch ``epoch``'s phases.

        Args:
            total: turns an epoch (`interleave.Interleave`: positions given to one source at
                once).
            steps: steps an epoch (at the schedule's world size).
            before: tiled turns before a step of an epoch (at that world size).
            split: each source's turns of a phase's turns.
            turn: positions a turn.
        """

        def phases(e: int) -> tuple[list[int], list[list[int]]]:
            first = schedule.phase_at(e * steps)
            inside = [
                k
                for k, s in enumerate(schedule.steps)
                if e * steps < s < (e + 1) * steps and k > first
            ]
            bounds = [before(schedule.steps[k] - e * steps) for k in inside]
            edges = [0, *bounds, total]
            counts = [
                split(k, b - a) for k, a, b in zip([first, *inside], edges, edges[1:], strict=False)
            ]
            return bounds, counts

        offsets = np.zeros(len(schedule.weights[0]), np.int64)
        e = 0
        while e < epoch:
            bounds, counts = phases(e)
            if bounds or not steps:
                offsets += np.asarray(counts, np.int64).sum(axis=0)
                e += 1
                continue
            # Epochs wholly in one phase, up to the next change.
            later = [s for s in schedule.steps if s > e * steps]
            stop = min(epoch, later[0] // steps) if later else epoch
            stop = max(stop, e + 1)
            offsets += (stop - e) * np.asarray(counts[0], np.int64)
            e = stop
        bounds, counts = phases(epoch)
        return cls(
            tuple(bounds),
            tuple(tuple(turn * c for c in cs) for cs in counts),
            tuple(int(turn * o) for o in offsets),
        )


def phase_split(schedule: Schedule, rows: Sequence[int], quotas: Any) -> Split:
    """Each source's turns of ``turns`` turns of a phase: ``quotas`` by the phase's weights."""

    def split(phase: int, turns: int) -> list[int]:
        return list(quotas(rows, schedule.weights[phase], turns))

    return split
