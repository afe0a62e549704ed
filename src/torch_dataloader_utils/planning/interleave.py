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
import itertools
from collections.abc import Sequence
from typing import Literal

import numpy as np

from ..errors import InvalidArgumentError
from .shuffle import window_order

__all__ = ["MIXINGS", "WINDOW", "Interleave", "Mixing", "merged_counts"]

Mixing = Literal["random", "stratified"]
MIXINGS: tuple[Mixing, ...] = ("random", "stratified")

# Rows of the global sequence whose sources are fixed together: the exact counts hold in each
# (and, for "random", it is permuted as one). A stream computes the windows it reads, one at a
# time (docs/adr/0020-measurements-behind-constants.md#mixing).
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

    ``turn``: positions are given to the sources ``turn`` at a time, a *turn* each (a packed
    mixture's turn is a sequence's tokens, ``Layout.seq_tokens``, all from one source); each
    count a multiple of it. The windows, keys and permutations then count turns.
    """

    def __init__(
        self,
        counts: Sequence[int],
        mixing: Mixing,
        *,
        seed: int,
        epoch: int,
        leg: int = 0,
        turn: int = 1,
        phase: int = 0,
    ) -> None:
        if mixing not in MIXINGS:
            raise InvalidArgumentError(f"mixing must be one of {MIXINGS}, got {mixing!r}")
        self.counts = tuple(int(c) for c in counts)
        self.total = sum(self.counts)
        self.turn = turn
        assert all(c % turn == 0 for c in self.counts), "counts are whole turns"
        # (The merge and the windows below count turns.)
        self._turns = tuple(c // turn for c in self.counts)
        self._turn_total = self.total // turn
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
        u, inside_turn = divmod(t, self.turn)
        w, inside = divmod(u, WINDOW)
        out += self.turn * self._merged(w * WINDOW)
        if inside:
            labels = self._window(w)[:inside]
            out += self.turn * np.bincount(labels, minlength=k)
        if inside_turn:
            out[int(self._window(w)[inside])] += inside_turn
        return out

    def prefixes(self, positions: Sequence[int] | np.ndarray) -> np.ndarray:
        """`prefix` of each of ``positions``, one row each: every window they fall in is
        computed once, and the merge at every window's edges in one vectorised search (an
        elastic resume asks for three positions of every old stream)."""
        k = len(self.counts)
        t = np.asarray(positions, np.int64).reshape(-1)
        if not self.total:
            return np.zeros((len(t), k), np.int64)
        repeats, at = np.divmod(t, self.total)
        u, inside_turn = np.divmod(at, self.turn)
        w, inside = np.divmod(u, WINDOW)
        windows, which = np.unique(w, return_inverse=True)
        edges = merged_counts(
            self._turns,
            np.concatenate(
                [windows * WINDOW, np.minimum((windows + 1) * WINDOW, self._turn_total)]
            ),
        )
        first, last = edges[: len(windows)], edges[len(windows) :]
        out: np.ndarray = repeats[:, None] * np.asarray(self.counts, np.int64)
        out += self.turn * first[which]
        # Only positions inside a window need its labels: one window's, at a time.
        by_window: dict[int, list[int]] = {}
        for p in np.flatnonzero((inside > 0) | (inside_turn > 0)).tolist():
            by_window.setdefault(int(which[p]), []).append(p)
        for index, mine in by_window.items():
            values, bounds = self._ranked(int(windows[index]), first[index], last[index])
            for p in mine:
                m, rest = int(inside[p]), int(inside_turn[p])
                if m:
                    head = values[:m]
                    below = [0, *(int(np.count_nonzero(head < b)) for b in bounds[:-1]), m]
                    out[p] += [self.turn * (b - a) for a, b in itertools.pairwise(below)]
                if rest:
                    out[p, int(np.searchsorted(bounds, values[m], side="right"))] += rest
        return out

    def ranges(self, start: int, stop: int) -> list[list[tuple[int, int]]]:
        """The range of each source's sequence that positions ``[start, stop)`` hold (one
        each here; a `phases.PhasedInterleave` gives one a phase)."""
        return source_ranges(self.prefix(start), self.prefix(stop))

    def labels(self, start: int, stop: int) -> np.ndarray:
        """The source of each position in ``[start, stop)`` (may pass ``R``: wraps)."""
        if self.turn == 1:
            return self.turn_labels(start, stop)
        first = start // self.turn
        turns = self.turn_labels(first, -(-stop // self.turn))
        at = first * self.turn
        return np.repeat(turns, self.turn)[start - at : stop - at]

    def turn_labels(self, start: int, stop: int) -> np.ndarray:
        """The source of each turn ``[start, stop)`` (turns of ``turn`` positions; wraps)."""
        taken: list[np.ndarray] = []
        pos = int(start)
        total = self._turn_total
        while pos < stop and total:
            at = pos % total
            w, inside = divmod(at, WINDOW)
            window = self._window(w)
            take = min(len(window) - inside, stop - pos, total - at)
            taken.append(window[inside : inside + take])
            pos += take
        if not taken:
            return np.zeros(0, np.int16)
        return np.concatenate(taken)

    # --- the windows ----------------------------------------------------------------------------

    def _window_labels(self, w: int) -> np.ndarray:
        """The sources of the turns of window ``w`` (``[w*WINDOW, (w+1)*WINDOW)`` cut at the
        sequence's end)."""
        lo, hi = w * WINDOW, min((w + 1) * WINDOW, self._turn_total)
        return self._labels(w, self._merged(lo), self._merged(hi))

    def _ranked(self, w: int, first: np.ndarray, last: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Window ``w``'s turns as values that tell their sources (turn ``m`` is source
        ``i``'s where ``bounds[i-1] <= values[m] < bounds[i]``): a random window's order
        (which of the sorted labels each turn takes: counted without gathering them), a
        stratified window's labels."""
        if self.mixing == "random":
            sizes = last - first
            return self._order(w, int(sizes.sum())), np.cumsum(sizes)
        return self._labels(w, first, last), np.arange(1, len(self.counts) + 1)

    def _order(self, w: int, n: int) -> np.ndarray:
        seed, epoch, leg, phase = self._key
        return window_order(n, seed=seed, epoch=epoch, leg=leg, window=w, phase=phase)

    def _labels(self, w: int, first: np.ndarray, last: np.ndarray) -> np.ndarray:
        """The sources of window ``w``'s turns, given the merge's counts at its edges."""
        labels = np.repeat(np.arange(len(self.counts), dtype=np.int16), last - first)
        if self.mixing == "random":
            shuffled: np.ndarray = labels[self._order(w, len(labels))]
            return shuffled
        # The merged order inside the window: key (2j + 1) / (2 q_i), ties by source. (Float
        # keys may order two keys closer than a float tells apart the other way round: the
        # window's counts stay the exact ones.)
        keys = np.concatenate(
            [
                (2.0 * np.arange(int(a), int(b)) + 1.0) / (2.0 * q)
                for a, b, q in zip(first, last, self._turns, strict=True)
                if b > a
            ]
            or [np.zeros(0)]
        )
        return labels[np.lexsort((labels, keys))]

    def _merged_counts(self, t: int) -> np.ndarray:
        """How many of the ``t`` first keys of the merge (key ``(2j + 1) / (2 q_i)`` for row
        ``j`` of source ``i``, ties by source) are each source's, in exact integers."""
        q = self._turns
        if t <= 0:
            return np.zeros(len(q), np.int64)
        if t >= self._turn_total:
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


def source_ranges(
    lo: Sequence[int] | np.ndarray, hi: Sequence[int] | np.ndarray
) -> list[list[tuple[int, int]]]:
    """Each source's range ``[lo, hi)`` of its sequence, as `Interleave.ranges` gives them
    (none where empty), from the prefix counts at a span's ends."""
    lo, hi = np.asarray(lo).tolist(), np.asarray(hi).tolist()
    return [[(a, b)] if b > a else [] for a, b in zip(lo, hi, strict=True)]


def merged_counts(turns: Sequence[int], ts: Sequence[int] | np.ndarray) -> np.ndarray:
    """`Interleave._merged_counts` of every ``t`` of ``ts`` at once (one row each): a binary
    search per source, vectorised over ``ts``, in exact integers (int64 where the products
    fit, Python integers past that)."""
    q = [int(x) for x in turns]
    top = max(q, default=0)
    dtype: type = np.int64 if 2 * (2 * top + 1) * top < 2**62 else object
    t: np.ndarray = np.clip(np.asarray(ts, np.int64).reshape(-1), 0, sum(q)).astype(dtype)
    out = np.zeros((len(t), len(q)), np.int64)
    for i, qi in enumerate(q):
        lo: np.ndarray = np.zeros(len(t), dtype)
        hi: np.ndarray = np.full(len(t), qi, dtype)
        while True:
            active = lo < hi
            if not active.any():
                break
            mid = (lo + hi) // 2
            less = _keys_before(q, i, mid) < t
            lo = np.where(active & less, mid + 1, lo)
            hi = np.where(active & ~less, mid, hi)
        out[:, i] = lo
    return out


def _keys_before(q: Sequence[int], i: int, j: np.ndarray) -> np.ndarray:
    """Keys of the merge before key ``(i, j)`` for each ``j`` (`Interleave._merged_counts`)."""
    x = 2 * j + 1
    n = j
    for i2, q2 in enumerate(q):
        if i2 == i or not q2:
            continue
        xq = x * q2
        n = n + np.minimum(q2, (-(-xq // q[i])) // 2)
        if i2 < i:  # an equal key of an earlier source
            n = n + ((xq % q[i] == 0) & ((xq // q[i]) % 2 == 1))
    return n
