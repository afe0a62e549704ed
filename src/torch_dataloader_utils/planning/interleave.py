"""Which source each position of a mixture's sequence belongs to (pure).

The positions are given to the sources in windows of `WINDOW` rows. A window's counts are fixed
by merging the sources' evenly spaced keys ``(2j + 1) / (2 q_i)`` (exactly, in integers), so
every window holds each source's share within a row or two. Inside a window, ``"stratified"``
keeps that merged order (every batch holds each source's share within a row or two) and
``"random"`` permutes it by ``(seed, epoch, leg, window)`` (batches vary around the shares, as
when drawing rows at random, while each window still holds its share).
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Literal

import numpy as np

from ..errors import InvalidArgumentError
from .shuffle import window_order

__all__ = ["MIXINGS", "WINDOW", "Interleave", "Mixing"]

Mixing = Literal["random", "stratified"]
MIXINGS: tuple[Mixing, ...] = ("random", "stratified")

# Rows of the global sequence whose sources are fixed together: the unit of the exact counts
# (and, for "random", of the permutation). A stream computes the windows it reads, one at a
# time: ~1 ms each.
WINDOW = 1 << 14


class Interleave:
    """Which source each position of a leg's global sequence belongs to.

    Args:
        counts: rows of each source in the leg's sequence (``R = sum(counts)`` positions).
        mixing: ``"random"`` or ``"stratified"``.
        seed, epoch, leg: key the ``"random"`` permutations.

    Positions past ``R`` wrap (padding): position ``t`` is position ``t % R`` of the
    ``t // R``-th repeat of the sequence.

    ``phase``: a weights schedule's phase (`phases.PhasedInterleave`), keying its own
    ``"random"`` permutations.

    ``unit``: positions are given ``unit`` at a time (a packed mixture's: a sequence's tokens
    come from one source); each count a multiple of it. The windows, keys and permutations
    then count units.
    """

    def __init__(
        self,
        counts: Sequence[int],
        mixing: Mixing,
        *,
        seed: int,
        epoch: int,
        leg: int = 0,
        unit: int = 1,
        phase: int = 0,
    ) -> None:
        if mixing not in MIXINGS:
            raise InvalidArgumentError(f"mixing must be one of {MIXINGS}, got {mixing!r}")
        self.counts = tuple(int(c) for c in counts)
        self.total = sum(self.counts)
        self.unit = unit
        assert all(c % unit == 0 for c in self.counts), "counts are whole units"
        # (The merge and the windows below count units.)
        self._units = tuple(c // unit for c in self.counts)
        self._unit_total = self.total // unit
        self.mixing = mixing
        self._key = (seed, epoch, leg, phase)
        self._window = functools.lru_cache(maxsize=4)(self._window_labels)
        self._merged = functools.lru_cache(maxsize=64)(self._merged_counts)

    # --- prefix counts --------------------------------------------------------------------------

    def prefix(self, t: int) -> np.ndarray:
        """Rows of each source among positions ``[0, t)`` (``t`` may pass ``R``: wraps)."""
        k = len(self.counts)
        if not self.total:
            return np.zeros(k, np.int64)
        repeats, t = divmod(int(t), self.total)
        out = np.asarray(self.counts, np.int64) * repeats
        u, inside_unit = divmod(t, self.unit)
        w, inside = divmod(u, WINDOW)
        out += self.unit * self._merged(w * WINDOW)
        if inside:
            labels = self._window(w)[:inside]
            out += self.unit * np.bincount(labels, minlength=k)
        if inside_unit:
            out[int(self._window(w)[inside])] += inside_unit
        return out

    def ranges(self, start: int, stop: int) -> list[list[tuple[int, int]]]:
        """The range of each source's sequence that positions ``[start, stop)`` hold (one
        each here; a `phases.PhasedInterleave` gives one a phase)."""
        lo, hi = self.prefix(start).tolist(), self.prefix(stop).tolist()
        return [[(a, b)] if b > a else [] for a, b in zip(lo, hi, strict=True)]

    def labels(self, start: int, stop: int) -> np.ndarray:
        """The source of each position in ``[start, stop)`` (may pass ``R``: wraps)."""
        if self.unit == 1:
            return self.unit_labels(start, stop)
        first = start // self.unit
        units = self.unit_labels(first, -(-stop // self.unit))
        at = first * self.unit
        return np.repeat(units, self.unit)[start - at : stop - at]

    def unit_labels(self, start: int, stop: int) -> np.ndarray:
        """The source of each unit ``[start, stop)`` (units of ``unit`` positions; wraps)."""
        parts: list[np.ndarray] = []
        pos = int(start)
        total = self._unit_total
        while pos < stop and total:
            at = pos % total
            w, inside = divmod(at, WINDOW)
            window = self._window(w)
            take = min(len(window) - inside, stop - pos, total - at)
            parts.append(window[inside : inside + take])
            pos += take
        if not parts:
            return np.zeros(0, np.int16)
        return np.concatenate(parts)

    # --- the windows ----------------------------------------------------------------------------

    def _window_labels(self, w: int) -> np.ndarray:
        """The sources of the units of window ``w`` (``[w*WINDOW, (w+1)*WINDOW)`` cut at the
        sequence's end)."""
        lo, hi = w * WINDOW, min((w + 1) * WINDOW, self._unit_total)
        first, last = self._merged(lo), self._merged(hi)
        sources = [
            np.full(int(b - a), i, np.int16)
            for i, (a, b) in enumerate(zip(first, last, strict=True))
        ]
        labels = np.concatenate(sources) if sources else np.zeros(0, np.int16)
        if self.mixing == "random":
            seed, epoch, leg, phase = self._key
            order = window_order(
                len(labels), seed=seed, epoch=epoch, leg=leg, window=w, phase=phase
            )
            shuffled: np.ndarray = labels[order]
            return shuffled
        # The merged order inside the window: key (2j + 1) / (2 q_i), ties by source. (Float
        # keys may order two keys closer than a float tells apart the other way round: the
        # window's counts stay the exact ones.)
        keys = np.concatenate(
            [
                (2.0 * np.arange(int(a), int(b)) + 1.0) / (2.0 * q)
                for a, b, q in zip(first, last, self._units, strict=True)
                if b > a
            ]
            or [np.zeros(0)]
        )
        return labels[np.lexsort((labels, keys))]

    def _merged_counts(self, t: int) -> np.ndarray:
        """How many of the ``t`` first keys of the merge (key ``(2j + 1) / (2 q_i)`` for row
        ``j`` of source ``i``, ties by source) are each source's, in exact integers."""
        q = self._units
        if t <= 0:
            return np.zeros(len(q), np.int64)
        if t >= self._unit_total:
            return np.asarray(q, np.int64)

        def before(i: int, j: int) -> int:
            # Keys that come before key (i, j): those smaller, and equal ones of earlier sources.
            x = 2 * j + 1
            n = j
            for i2, q2 in enumerate(q):
                if i2 == i or not q2:
                    continue
                m = -(-(x * q2) // q[i])  # ceil(x * q2 / q_i)
                n += min(q2, m // 2)
                if i2 < i and (x * q2) % q[i] == 0 and (x * q2 // q[i]) % 2 == 1:
                    n += 1  # an equal key of an earlier source
            return n

        out = []
        for i, qi in enumerate(q):
            lo, hi = 0, qi  # the number of source i's keys among the first t
            while lo < hi:
                mid = (lo + hi) // 2
                if before(i, mid) < t:
                    lo = mid + 1
                else:
                    hi = mid
            out.append(lo)
        return np.asarray(out, np.int64)
