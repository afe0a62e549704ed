"""A mixture's epoch whose weights change inside it (pure): where each phase's positions are on
a topology, and which source each position holds (ADR 0023).

A weights schedule changes the weights at steps (batches of every rank at once). A step is at a
different position in each stream's span (`mixture_spans` cuts the sequence rank by rank), so
a phase is not a range of the leg's sequence: it is, in each stream, the stream's positions of
the phase's steps. `Tiling` finds them: the *tiled units before step b* count, over every
rank, the units of the rank's first ``b`` batches (round robin over its workers), and a
rank's units no batch delivers (``drop``, ``drop_last``) once its last batch is past. A
change at ``X`` tiled units is cut the same way on any topology (`Tiling.cut`), so a
schedule's phases hold the same number of units whatever reads them.

`PhasedInterleave` then gives each phase its own `Interleave` over the phase's positions taken
in sequence order (each stream's part of a phase is a contiguous run of them): a batch holds
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

__all__ = ["Labels", "PhaseCounts", "PhasedInterleave", "Tiling", "unit_layout"]

PhaseCounts = list[list[int]] | None  # each phase's positions of each source (None: one phase)


@dataclass(frozen=True)
class _Rank:
    spans: tuple[tuple[int, int], ...]  # each worker's units, clipped to the sequence
    counts: tuple[int, ...]  # each worker's batches
    gap: tuple[int, int]  # the rank's units no batch delivers
    batch: int  # units a batch

    @property
    def last(self) -> int:
        """The step after which the gap counts as tiled (at least 1, so step 0 has none)."""
        return max(1, sum(self.counts))

    def done(self, steps: int) -> list[int]:
        """Units each worker delivered in the rank's first ``steps`` batches."""
        return [
            min(d * self.batch, b - a)
            for d, (a, b) in zip(consumed(self.counts, steps), self.spans, strict=True)
        ]

    def tiled(self, steps: int) -> int:
        gap = self.gap[1] - self.gap[0] if steps >= self.last else 0
        return sum(self.done(steps)) + gap


@dataclass(frozen=True)
class Tiling:
    """A leg's sequence of ``total`` units as ``world_size`` ranks of ``num_workers`` workers
    read it, step by step (``layout``: counted in units)."""

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
        """Steps after which every unit is tiled."""
        return max(r.last for r in self.ranks)

    def before(self, steps: int) -> int:
        """Tiled units before step ``steps``."""
        return sum(r.tiled(steps) for r in self.ranks)

    def cut(self, units: int) -> list[tuple[list[int], int]]:
        """Where the first ``units`` tiled units end, in step order: each rank's units of each
        worker's span, and of its gap, inside them."""
        lo, hi = 0, self.steps  # the last step whose units before it fit
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if self.before(mid) <= units:
                lo = mid
            else:
                hi = mid - 1
        left = units - self.before(lo)
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

    def segments(self, bounds: Sequence[int]) -> list[tuple[int, int, int]]:
        """The sequence's units as ``(start, stop, phase)`` runs in order, for phases that
        begin ``bounds`` tiled units in (the first at 0)."""
        cuts = [self.cut(x) for x in bounds]
        out: list[tuple[int, int, int]] = []
        for r, rank in enumerate(self.ranks):
            parts = [*rank.spans, rank.gap]
            for w, (a, b) in enumerate(parts):
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
        segments: the sequence's units as ``(start, stop, phase)`` runs in order
            (`Tiling.segments`).
        counts: positions of each source in each phase (whole units).
        unit: positions per unit.
    """

    def __init__(
        self,
        segments: Sequence[tuple[int, int, int]],
        counts: Sequence[Sequence[int]],
        mixing: Mixing,
        *,
        seed: int,
        epoch: int,
        leg: int = 0,
        unit: int = 1,
    ) -> None:
        self.unit = unit
        self.mixing = mixing
        self.phases = [list(c) for c in counts]
        self._phases = [
            Interleave(c, mixing, seed=seed, epoch=epoch, leg=leg, unit=unit, phase=p)
            for p, c in enumerate(counts)
        ]
        per_phase = np.asarray(counts, np.int64).reshape(len(counts), -1)
        self.counts = tuple(int(c) for c in per_phase.sum(axis=0))
        self.total = sum(self.counts)
        self._bases = np.cumsum(per_phase, axis=0) - per_phase  # rows before each phase
        seg = np.asarray(segments, np.int64).reshape(-1, 3)
        self._starts, self._stops, self._phase = seg[:, 0], seg[:, 1], seg[:, 2]
        lengths = self._stops - self._starts
        self._v = np.zeros(len(seg), np.int64)  # each run's first unit in its phase
        self._runs = [np.flatnonzero(self._phase == p) for p in range(len(counts))]
        for mine in self._runs:
            self._v[mine] = np.cumsum(lengths[mine]) - lengths[mine]

    def _pieces(self, start: int, stop: int) -> list[tuple[int, int, int, int]]:
        """``(repeat, phase, first, last)`` of units ``[start, stop)`` (wrapping), each piece
        inside one run: ``first``/``last`` count units of the phase."""
        total = self.total // self.unit
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

    def unit_labels(self, start: int, stop: int) -> np.ndarray:
        """The source of each unit ``[start, stop)`` (wraps)."""
        parts = [self._phases[p].unit_labels(a, b) for _, p, a, b in self._pieces(start, stop)]
        return np.concatenate(parts) if parts else np.zeros(0, np.int16)

    def labels(self, start: int, stop: int) -> np.ndarray:
        """The source of each position in ``[start, stop)`` (wraps)."""
        first = start // self.unit
        units = self.unit_labels(first, -(-stop // self.unit))
        at = first * self.unit
        return np.repeat(units, self.unit)[start - at : stop - at]

    def prefix(self, t: int) -> np.ndarray:
        """Rows of each source among positions ``[0, t)`` (``t`` may pass the end: wraps)."""
        u, inside = divmod(int(t), self.unit)
        repeats, at = divmod(u, self.total // self.unit) if self.total else (0, 0)
        out = repeats * np.asarray(self.counts, np.int64)
        # Each phase's units before ``at``: one lookup a phase, not a walk over every stream.
        for mine, interleave in zip(self._runs, self._phases, strict=True):
            s = int(np.searchsorted(self._starts[mine], at, side="right")) - 1
            if s >= 0:
                seg = mine[s]
                took = int(self._v[seg]) + min(at, int(self._stops[seg])) - int(self._starts[seg])
                out += interleave.prefix(took * self.unit)
        if inside:
            out[int(self.unit_labels(u, u + 1)[0])] += inside
        return out

    def prefixes(self, positions: Sequence[int] | np.ndarray) -> np.ndarray:
        """`prefix` of each of ``positions``, one row each (each phase's in one call)."""
        t = np.asarray(positions, np.int64).reshape(-1)
        u, inside = np.divmod(t, self.unit)
        if self.total:
            repeats, at = np.divmod(u, self.total // self.unit)
        else:
            repeats, at = np.zeros_like(u), np.zeros_like(u)
        out = repeats[:, None] * np.asarray(self.counts, np.int64)
        for mine, interleave in zip(self._runs, self._phases, strict=True):
            s = np.searchsorted(self._starts[mine], at, side="right") - 1
            has = np.flatnonzero(s >= 0)
            seg = mine[s[has]]
            took = self._v[seg] + np.minimum(at[has], self._stops[seg]) - self._starts[seg]
            out[has] += interleave.prefixes(took * self.unit)
        for p in np.flatnonzero(inside).tolist():
            out[p, int(self.unit_labels(int(u[p]), int(u[p]) + 1)[0])] += inside[p]
        return out

    def ranges_by_piece(
        self, start: int, stop: int
    ) -> list[tuple[int, int, np.ndarray, np.ndarray]]:
        """For each piece of units ``[start, stop)``: its repeat and phase, and the first and
        last rows of each source's sequence it holds."""
        out = []
        q = np.asarray(self.counts, np.int64)
        for repeat, p, a, b in self._pieces(start, stop):
            base = self._bases[p] + repeat * q
            interleave = self._phases[p]
            lo = base + interleave.prefix(a * self.unit)
            hi = base + interleave.prefix(b * self.unit)
            out.append((repeat, p, lo, hi))
        return out

    def ranges(self, start: int, stop: int) -> list[list[tuple[int, int]]]:
        """The ranges of each source's sequence that positions ``[start, stop)`` hold, in
        order (whole units)."""
        assert start % self.unit == 0 and stop % self.unit == 0, "ranges of whole units"
        out: list[list[tuple[int, int]]] = [[] for _ in self.counts]
        for _, _, lo, hi in self.ranges_by_piece(start // self.unit, stop // self.unit):
            for i, (a, b) in enumerate(zip(lo.tolist(), hi.tolist(), strict=True)):
                if b <= a:
                    continue
                if out[i] and out[i][-1][1] == a:
                    out[i][-1] = (out[i][-1][0], b)
                else:
                    out[i].append((a, b))
        return out


Labels = Interleave | PhasedInterleave  # which source each position of a leg's sequence holds


def unit_layout(layout: Layout) -> Layout:
    """``layout`` counted in units (a packed mixture's sequences; rows otherwise)."""
    unit = max(1, layout.unit)
    return dataclasses.replace(layout, batch_size=layout.batch_size // unit)
