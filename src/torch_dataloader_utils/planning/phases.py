"""A mixture's epoch whose weights change inside it (pure): where each phase's positions are on
a topology, and which source each position holds (ADR 0023).

A weights schedule changes the weights at steps (batches of every rank at once). A step is at a
different position in each stream's span (`mixture_spans` cuts the sequence rank by rank), so
a phase is not a range of the leg's sequence: it is, in each stream, the stream's positions of
the phase's steps. `Tiling` finds them, counting turns (`interleave.Interleave`: the positions
given to one source at once, a packed mixture's sequence or else a row): the *tiled turns
before step b* count, over every rank, the turns of the rank's first ``b`` batches (round
robin over its workers), and a rank's turns no batch delivers (``drop``, ``drop_last``) once
its last batch is past. A change at ``X`` tiled turns is cut the same way on any topology
(`Tiling.cut`), so a schedule's phases hold the same number of turns whatever reads them.

`PhasedInterleave` then gives each phase its own `Interleave` over the phase's positions taken
in sequence order (each stream's positions of a phase are a contiguous range): a batch holds
each source's share of its phase as exactly as one interleave gives it, and each source's
rows go in order, phase after phase.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property

import numpy as np

from .interleave import Interleave, Mixing
from .layout import Layout
from .resume import consumed, stream_spans

__all__ = ["Labels", "PhaseCounts", "PhasedInterleave", "Tiling", "turn_layout"]

PhaseCounts = list[list[int]] | None  # each phase's positions of each source (None: one phase)


@dataclass(frozen=True)
class _Rank:
    spans: tuple[tuple[int, int], ...]  # each worker's turns, clipped to the sequence
    counts: tuple[int, ...]  # each worker's batches
    gap: tuple[int, int]  # the rank's turns no batch delivers
    batch: int  # turns a batch

    @property
    def last(self) -> int:
        """The step after which the gap counts as tiled (at least 1, so step 0 has none)."""
        return max(1, sum(self.counts))

    def done(self, steps: int) -> list[int]:
        """Turns each worker delivered in the rank's first ``steps`` batches."""
        return [
            min(d * self.batch, b - a)
            for d, (a, b) in zip(consumed(self.counts, steps), self.spans, strict=True)
        ]

    def tiled(self, steps: int) -> int:
        gap = self.gap[1] - self.gap[0] if steps >= self.last else 0
        return sum(self.done(steps)) + gap


@dataclass(frozen=True)
class Tiling:
    """A leg's sequence of ``total`` turns as ``world_size`` ranks of ``num_workers`` workers
    read it, step by step (``layout``: counted in turns, `turn_layout`)."""

    total: int
    world_size: int
    num_workers: int
    layout: Layout

    @cached_property
    def ranks(self) -> tuple[_Rank, ...]:
        out = []
        for rank in range(self.world_size):
            spans = stream_spans(
                self.total,
                rank=rank,
                world_size=self.world_size,
                num_workers=self.num_workers,
                layout=self.layout,
            )
            counts = tuple(self.layout.batches(b - a) for a, b in spans)
            clipped = tuple((min(a, self.total), min(b, self.total)) for a, b in spans)
            first = spans[0][0]
            region_end = self.total
            if rank + 1 < self.world_size:
                after = stream_spans(
                    self.total,
                    rank=rank + 1,
                    world_size=self.world_size,
                    num_workers=1,
                    layout=self.layout,
                )
                region_end = min(after[0][0], self.total)
            end = max(min(first, self.total), *(b for _, b in clipped))
            gap = (end, max(end, region_end))
            out.append(_Rank(clipped, counts, gap, self.layout.batch_size))
        return tuple(out)

    @cached_property
    def steps(self) -> int:
        """Steps after which every turn is tiled."""
        return max(r.last for r in self.ranks)

    def before(self, steps: int) -> int:
        """Tiled turns before step ``steps``."""
        return sum(r.tiled(steps) for r in self.ranks)

    def cut(self, turns: int) -> list[tuple[list[int], int]]:
        """Where the first ``turns`` tiled turns end, in step order: each rank's turns of each
        worker's span, and of its gap, inside them."""
        lo, hi = 0, self.steps  # the last step whose turns before it fit
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if self.before(mid) <= turns:
                lo = mid
            else:
                hi = mid - 1
        left = turns - self.before(lo)
        out = []
        for rank in self.ranks:
            done = rank.done(lo)
            gap = rank.gap[1] - rank.gap[0] if lo >= rank.last else 0
            more = min(left, rank.tiled(lo + 1) - rank.tiled(lo)) if lo < self.steps else 0
            left -= more
            if more:
                after = rank.done(lo + 1)
                for w, (a, b) in enumerate(zip(done, after, strict=True)):
                    give = min(more, b - a)
                    done[w] += give
                    more -= give
                gap += more  # (the rank's last batch: its gap follows it)
            out.append((done, gap))
        return out

    def phase_runs(self, bounds: Sequence[int]) -> list[tuple[int, int, int]]:
        """The sequence's turns as ``(start, stop, phase)`` runs in order, for phases that
        begin ``bounds`` tiled turns in (the first at 0)."""
        cuts = [self.cut(x) for x in bounds]
        out: list[tuple[int, int, int]] = []
        for r, rank in enumerate(self.ranks):
            ranges = [*rank.spans, rank.gap]
            for w, (a, b) in enumerate(ranges):
                edges = [a]
                for c in cuts:
                    done, gap = c[r]
                    edges.append(a + (done[w] if w < len(rank.spans) else gap))
                edges.append(b)
                for phase, (x, y) in enumerate(itertools.pairwise(edges)):
                    if y > x:
                        out.append((x, y, phase))
        return out


class PhasedInterleave:
    """`Interleave` of a leg's sequence whose phases each hold their own counts of each source
    (see the module docstring); the same methods, and `ranges`.

    Args:
        phase_runs: the sequence's turns as ``(start, stop, phase)`` runs in order
            (`Tiling.phase_runs`).
        counts: positions of each source in each phase (whole turns).
        turn: positions per turn (`Interleave`).
    """

    def __init__(
        self,
        phase_runs: Sequence[tuple[int, int, int]],
        counts: Sequence[Sequence[int]],
        mixing: Mixing,
        *,
        seed: int,
        epoch: int,
        leg: int = 0,
        turn: int = 1,
    ) -> None:
        self.turn = turn
        self.mixing = mixing
        self.phases = [list(c) for c in counts]
        self._phases = [
            Interleave(c, mixing, seed=seed, epoch=epoch, leg=leg, turn=turn, phase=p)
            for p, c in enumerate(counts)
        ]
        per_phase = np.asarray(counts, np.int64).reshape(len(counts), -1)
        self.counts = tuple(int(c) for c in per_phase.sum(axis=0))
        self.total = sum(self.counts)
        self._bases = np.cumsum(per_phase, axis=0) - per_phase  # rows before each phase
        runs = np.asarray(phase_runs, np.int64).reshape(-1, 3)
        self._starts, self._stops, self._phase = runs[:, 0], runs[:, 1], runs[:, 2]
        lengths = self._stops - self._starts
        self._v = np.zeros(len(runs), np.int64)  # each run's first turn in its phase
        self._runs = [np.flatnonzero(self._phase == p) for p in range(len(counts))]
        for mine in self._runs:
            self._v[mine] = np.cumsum(lengths[mine]) - lengths[mine]

    def _stretches(self, start: int, stop: int) -> list[tuple[int, int, int, int]]:
        """``(repeat, phase, first, last)`` of turns ``[start, stop)`` (wrapping), each stretch
        inside one run: ``first``/``last`` count turns of the phase."""
        total = self.total // self.turn
        out = []
        pos = start
        while pos < stop and total:
            repeat, at = divmod(pos, total)
            s = int(np.searchsorted(self._starts, at, side="right")) - 1
            take = min(int(self._stops[s]) - at, stop - pos)
            first = int(self._v[s]) + at - int(self._starts[s])
            out.append((repeat, int(self._phase[s]), first, first + take))
            pos += take
        return out

    def turn_labels(self, start: int, stop: int) -> np.ndarray:
        """The source of each turn ``[start, stop)`` (wraps)."""
        labels = [self._phases[p].turn_labels(a, b) for _, p, a, b in self._stretches(start, stop)]
        return np.concatenate(labels) if labels else np.zeros(0, np.int16)

    def labels(self, start: int, stop: int) -> np.ndarray:
        """The source of each position in ``[start, stop)`` (wraps)."""
        first = start // self.turn
        turns = self.turn_labels(first, -(-stop // self.turn))
        at = first * self.turn
        return np.repeat(turns, self.turn)[start - at : stop - at]

    def prefix(self, t: int) -> np.ndarray:
        """Rows of each source among positions ``[0, t)`` (``t`` may pass the end: wraps)."""
        u, inside = divmod(int(t), self.turn)
        repeats, at = divmod(u, self.total // self.turn) if self.total else (0, 0)
        out = repeats * np.asarray(self.counts, np.int64)
        # Each phase's turns before ``at``: one lookup a phase, not a walk over every stream.
        for mine, interleave in zip(self._runs, self._phases, strict=True):
            s = int(np.searchsorted(self._starts[mine], at, side="right")) - 1
            if s >= 0:
                run = mine[s]
                took = int(self._v[run]) + min(at, int(self._stops[run])) - int(self._starts[run])
                out += interleave.prefix(took * self.turn)
        if inside:
            out[int(self.turn_labels(u, u + 1)[0])] += inside
        return out

    def prefixes(self, positions: Sequence[int] | np.ndarray) -> np.ndarray:
        """`prefix` of each of ``positions``, one row each (each phase's in one call)."""
        t = np.asarray(positions, np.int64).reshape(-1)
        u, inside = np.divmod(t, self.turn)
        if self.total:
            repeats, at = np.divmod(u, self.total // self.turn)
        else:
            repeats, at = np.zeros_like(u), np.zeros_like(u)
        out = repeats[:, None] * np.asarray(self.counts, np.int64)
        for mine, interleave in zip(self._runs, self._phases, strict=True):
            s = np.searchsorted(self._starts[mine], at, side="right") - 1
            has = np.flatnonzero(s >= 0)
            run = mine[s[has]]
            took = self._v[run] + np.minimum(at[has], self._stops[run]) - self._starts[run]
            out[has] += interleave.prefixes(took * self.turn)
        for p in np.flatnonzero(inside).tolist():
            out[p, int(self.turn_labels(int(u[p]), int(u[p]) + 1)[0])] += inside[p]
        return out

    def ranges_by_stretch(
        self, start: int, stop: int
    ) -> list[tuple[int, int, np.ndarray, np.ndarray]]:
        """For each stretch of turns ``[start, stop)`` (inside one phase run): its repeat and
        phase, and the first and last rows of each source's sequence it holds."""
        out = []
        q = np.asarray(self.counts, np.int64)
        for repeat, p, a, b in self._stretches(start, stop):
            base = self._bases[p] + repeat * q
            interleave = self._phases[p]
            lo = base + interleave.prefix(a * self.turn)
            hi = base + interleave.prefix(b * self.turn)
            out.append((repeat, p, lo, hi))
        return out

    def ranges(self, start: int, stop: int) -> list[list[tuple[int, int]]]:
        """The ranges of each source's sequence that positions ``[start, stop)`` hold, in
        order (whole turns)."""
        assert start % self.turn == 0 and stop % self.turn == 0, "ranges of whole turns"
        out: list[list[tuple[int, int]]] = [[] for _ in self.counts]
        for _, _, lo, hi in self.ranges_by_stretch(start // self.turn, stop // self.turn):
            for i, (a, b) in enumerate(zip(lo.tolist(), hi.tolist(), strict=True)):
                if b <= a:
                    continue
                if out[i] and out[i][-1][1] == a:
                    out[i][-1] = (out[i][-1][0], b)
                else:
                    out[i].append((a, b))
        return out


Labels = Interleave | PhasedInterleave  # which source each position of a leg's sequence holds


def turn_layout(layout: Layout) -> Layout:
    """``layout`` counted in turns (a packed mixture's sequences; rows otherwise)."""
    turn = max(1, layout.seq_tokens)
    return dataclasses.replace(layout, batch_size=layout.batch_size // turn)
