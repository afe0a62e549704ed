"""Mixtures: several sources in one epoch, each with its quota of rows (pure).

The model, for sources ``0..k-1`` (docs/concepts/mixtures.md, ADR 0013):

- Source ``i`` delivers ``q_i`` rows an epoch (`quotas`: ``epoch_rows`` split by the weights,
  largest remainders, so they add up).
- Its rows come from an endless sequence of passes over it: pass ``p`` is all its chunks in the
  order ``(seed, source, p)`` fixes. Epoch ``e`` reads positions ``[e*q_i, (e+1)*q_i)`` of that
  sequence (`SourceEpoch`): a source smaller than its quota repeats, all of its rows before any
  row twice; a larger one goes on next epoch where it stopped. Nothing is kept between epochs:
  the epoch number says where each source stands.
- The epoch's global sequence interleaves the sources (`Interleave`): ``R = sum(q)`` positions,
  each a row of one source, the sources in proportion all along it. The streams cut it exactly
  as they cut one source's epoch: equal spans per rank, batch-aligned spans per worker. A
  stream's span ``[a, b)`` holds rows ``[P_i(a), P_i(b))`` of each source's sequence (``P``: the
  interleave's prefix counts), so each source's part of a stream is contiguous and is read,
  shuffled in blocks and resumed as a one-source stream is.

How the positions of a window of `WINDOW` rows are given to the sources: the window's counts
are fixed by merging the sources' evenly spaced keys ``(2j + 1) / (2 q_i)`` (exactly, in
integers), so every window holds each source's share within a row or two. Inside a window,
``"stratified"`` keeps that merged order (every batch holds each source's share within a row or
two) and ``"random"`` permutes it by ``(seed, epoch, leg, window)`` (batches vary around the
shares, as when drawing rows at random, while each window still holds its share).
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import Literal

import numpy as np

from ..errors import InvalidArgumentError
from .layout import Layout
from .resume import Leg, block_rest, consumed, stream_batches, stream_spans
from .sequence import Deferred, Item, Run, cut, sequence_length
from .strategy import EpochRows
from .topology import Topology

__all__ = [
    "MIXINGS",
    "WINDOW",
    "Interleave",
    "MixEpoch",
    "Mixture",
    "Mixing",
    "SourceEpoch",
    "quotas",
    "source_layouts",
    "source_order",
]

Mixing = Literal["random", "stratified"]
MIXINGS: tuple[Mixing, ...] = ("random", "stratified")

# Rows of the global sequence whose sources are fixed together: the unit of the exact counts
# (and, for "random", of the permutation). A stream computes the windows it reads, one at a
# time: ~1 ms each.
WINDOW = 1 << 14


def quotas(
    rows: Sequence[int], weights: Sequence[float] | None, epoch_rows: int | None
) -> list[int]:
    """Rows each source delivers an epoch.

    With neither ``weights`` nor ``epoch_rows``: every row of every source once. Otherwise
    ``epoch_rows`` (default: the rows of all sources) split in proportion to ``weights``
    (default: to the sources' rows), rounded by largest remainders (ties: the earlier source),
    so the quotas add up to ``epoch_rows``.

    Raises:
        InvalidArgumentError: a weight is negative or not finite, all are zero, ``epoch_rows``
            is negative, or a source with a quota has no rows.
    """
    rows = [int(n) for n in rows]
    if weights is None and epoch_rows is None:
        return rows
    total = sum(rows) if epoch_rows is None else int(epoch_rows)
    if total < 0:
        raise InvalidArgumentError(f"epoch_rows must be >= 0, got {epoch_rows}")
    w = [float(x) for x in (rows if weights is None else weights)]
    if len(w) != len(rows):
        raise InvalidArgumentError(f"{len(w)} weights for {len(rows)} sources")
    if any(not np.isfinite(x) or x < 0 for x in w):
        raise InvalidArgumentError(f"weights must be finite and >= 0, got {list(w)}")
    whole = sum(w)
    if whole <= 0:
        raise InvalidArgumentError("at least one source needs a weight above 0")
    # Exact shares as fractions of integers where the weights are integers (the common case),
    # so that equal weights split exactly; floats otherwise.
    if all(float(x).is_integer() for x in w):
        iw = [int(x) for x in w]
        iwhole = sum(iw)
        base = [total * x // iwhole for x in iw]
        rest = [total * x % iwhole for x in iw]
    else:
        exact = [total * x / whole for x in w]
        base = [int(np.floor(x)) for x in exact]
        rest = [x - b for x, b in zip(exact, base, strict=True)]  # type: ignore[misc]
    short = total - sum(base)
    for i in sorted(range(len(w)), key=lambda i: (-rest[i], i))[:short]:
        base[i] += 1
    for i, (q, n) in enumerate(zip(base, rows, strict=True)):
        if q and not n:
            raise InvalidArgumentError(f"source {i} has no rows, but a quota of {q} rows")
    return base


def source_order(
    num_chunks: int, *, seed: int, source: int, passes: int, shuffle: bool
) -> np.ndarray:
    """The chunk order of pass ``passes`` over source ``source``."""
    if not shuffle:
        return np.arange(num_chunks)
    return np.random.default_rng([seed, passes, 0x0C, 0x5C, source]).permutation(num_chunks)


@dataclass(frozen=True, eq=False)
class SourceEpoch(EpochRows):
    """The rows source ``source`` delivers in an epoch: positions ``[epoch*quota,
    (epoch+1)*quota)`` of its passes concatenated.

    ``order`` and ``rows`` list the chunks of the passes the epoch touches, in order (the
    first leg's seed and shuffle fix it); the epoch's rows are one run of them (`fresh`). What
    is left of them after elastic resumes is worked out by the mixture (`MixEpoch.items`).
    """

    source: int = 0
    quota: int = 0

    @cached_property
    def _passes(self) -> tuple[int, int, int]:
        """First pass the epoch touches, one past the last, and the source's rows."""
        total = int(np.sum(np.asarray(self.chunk_rows, dtype=np.int64)))
        if not self.quota or not total:
            return 0, 0, total
        start = self.epoch * self.quota
        return start // total, -(-(start + self.quota) // total), total

    @cached_property
    def order(self) -> np.ndarray:
        first, stop, _ = self._passes
        first_layout = self.legs[0].layout if self.legs else self.layout
        n = len(self.chunk_rows)
        parts = [
            source_order(
                n,
                seed=first_layout.seed,
                source=self.source,
                passes=p,
                shuffle=first_layout.shuffle,
            )
            for p in range(first, stop)
        ]
        out: np.ndarray = np.concatenate(parts).astype(np.int64) if parts else np.zeros(0, np.int64)
        return out

    @cached_property
    def fresh(self) -> list[Item]:
        """The epoch's rows: one run of the concatenated passes (none for a zero quota)."""
        first, _, total = self._passes
        if not self.quota:
            return []
        start = self.epoch * self.quota - first * total
        return [Run(start, start + self.quota)]

    @cached_property
    def sequence(self) -> list[Item]:
        return self.fresh


class Interleave:
    """Which source each position of a leg's global sequence belongs to.

    Args:
        counts: rows of each source in the leg's sequence (``R = sum(counts)`` positions).
        mixing: ``"random"`` or ``"stratified"``.
        seed, epoch, leg: key the ``"random"`` permutations.

    Positions past ``R`` wrap (padding): position ``t`` is position ``t % R`` of the
    ``t // R``-th repeat of the sequence.
    """

    def __init__(
        self, counts: Sequence[int], mixing: Mixing, *, seed: int, epoch: int, leg: int = 0
    ) -> None:
        if mixing not in MIXINGS:
            raise InvalidArgumentError(f"mixing must be one of {MIXINGS}, got {mixing!r}")
        self.counts = tuple(int(c) for c in counts)
        self.total = sum(self.counts)
        self.mixing = mixing
        self._key = (seed, epoch, leg)
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
        w, inside = divmod(t, WINDOW)
        out += self._merged(w * WINDOW)
        if inside:
            labels = self._window(w)[:inside]
            out += np.bincount(labels, minlength=k)
        return out

    def labels(self, start: int, stop: int) -> np.ndarray:
        """The source of each position in ``[start, stop)`` (may pass ``R``: wraps)."""
        parts: list[np.ndarray] = []
        pos = int(start)
        while pos < stop and self.total:
            at = pos % self.total if self.total else 0
            w, inside = divmod(at, WINDOW)
            window = self._window(w)
            take = min(len(window) - inside, stop - pos, self.total - at)
            parts.append(window[inside : inside + take])
            pos += take
        if not parts:
            return np.zeros(0, np.int16)
        return np.concatenate(parts)

    # --- the windows ----------------------------------------------------------------------------

    def _window_labels(self, w: int) -> np.ndarray:
        """The sources of the positions of window ``w`` (``[w*WINDOW, (w+1)*WINDOW)`` cut at R)."""
        lo, hi = w * WINDOW, min((w + 1) * WINDOW, self.total)
        first, last = self._merged(lo), self._merged(hi)
        sources = [
            np.full(int(b - a), i, np.int16)
            for i, (a, b) in enumerate(zip(first, last, strict=True))
        ]
        labels = np.concatenate(sources) if sources else np.zeros(0, np.int16)
        if self.mixing == "random":
            seed, epoch, leg = self._key
            rng = np.random.default_rng([seed, epoch, leg, w, 0x313])
            return labels[rng.permutation(len(labels))]
        # The merged order inside the window: key (2j + 1) / (2 q_i), ties by source. (Float
        # keys may order two keys closer than a float tells apart the other way round: the
        # window's counts stay the exact ones.)
        keys = np.concatenate(
            [
                (2.0 * np.arange(int(a), int(b)) + 1.0) / (2.0 * q)
                for a, b, q in zip(first, last, self.counts, strict=True)
                if b > a
            ]
            or [np.zeros(0)]
        )
        return labels[np.lexsort((labels, keys))]

    def _merged_counts(self, t: int) -> np.ndarray:
        """How many of the ``t`` first keys of the merge (key ``(2j + 1) / (2 q_i)`` for row
        ``j`` of source ``i``, ties by source) are each source's, in exact integers."""
        q = self.counts
        if t <= 0:
            return np.zeros(len(q), np.int64)
        if t >= self.total:
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


def source_layouts(layout: Layout, counts: Sequence[int]) -> list[Layout]:
    """Each source's blocks in a leg whose sequence holds ``counts`` rows of each: its share of
    the mixture's block sizes (a worker holds a block of every source at once: about one
    mixture block in all), at least one row. A source's rows are then shuffled over the same
    stretch of the global sequence as every other source's."""
    total = sum(counts)
    out = []
    for count in counts:
        share = count / total if total else 0.0
        block = max(1, math.ceil(layout.block_rows * share))
        first = max(1, min(block, math.ceil(layout.first_block_rows * share)))
        out.append(dataclasses.replace(layout, block_rows=block, first_block_rows=first))
    return out


@dataclass(frozen=True, eq=False)
class MixEpoch:
    """The rows a pass over a mixture's epoch reads: each source's epoch, and after elastic
    resumes, what earlier legs left of each.

    Attributes:
        chunk_rows: rows of each chunk of each source, in each source's plan order.
        quotas: rows of each source an epoch.
        mixing: how positions are given to the sources (`Interleave`).
        epoch: the epoch.
        legs: earlier legs of the epoch (each an elastic resume's old topology).
        layout: the current leg's layout.
    """

    chunk_rows: tuple[np.ndarray, ...]
    quotas: tuple[int, ...]
    mixing: Mixing
    epoch: int
    legs: tuple[Leg, ...]
    layout: Layout

    @property
    def first(self) -> Layout:
        """The first leg's layout: its seed and shuffle fix the epoch's orders."""
        return self.legs[0].layout if self.legs else self.layout

    @cached_property
    def sources(self) -> tuple[SourceEpoch, ...]:
        """Each source's epoch (its chunk order over the passes the epoch touches)."""
        # (With the legs: a source's chunk order is its first leg's, whatever layout it is
        # read with now.)
        return tuple(
            SourceEpoch(rows, self.epoch, self.legs, self.layout, source=i, quota=q)
            for i, (rows, q) in enumerate(zip(self.chunk_rows, self.quotas, strict=True))
        )

    def interleave(self, items: Sequence[Sequence[Item]], depth: int) -> Interleave:
        """The interleave of leg ``depth``, whose sequence holds ``items`` of each source."""
        counts = [sequence_length(x) for x in items]
        return Interleave(counts, self.mixing, seed=self.first.seed, epoch=self.epoch, leg=depth)

    @cached_property
    def items(self) -> list[list[Item]]:
        """What the current leg reads of each source's epoch."""
        items: list[list[Item]] = [list(s.fresh) for s in self.sources]
        for depth, leg in enumerate(self.legs):
            items = self._remaining(items, leg, depth)
        return items

    @cached_property
    def current(self) -> Interleave:
        """The current leg's interleave."""
        return self.interleave(self.items, len(self.legs))

    @cached_property
    def layouts(self) -> list[Layout]:
        """Each source's layout (block sizes) in the current leg."""
        return source_layouts(self.layout, self.current.counts)

    @property
    def total(self) -> int:
        """Rows of the current leg's sequence."""
        return self.current.total

    def source_epoch(self, source: int) -> SourceEpoch:
        """Source ``source``'s epoch, with its current leg's layout (for reading pieces)."""
        epoch = self.sources[source]
        return dataclasses.replace(epoch, layout=self.layouts[source])

    def parts(self, start: int, stop: int) -> list[list[Run]]:
        """The runs of each source's sequence that positions ``[start, stop)`` of the current
        leg's sequence hold."""
        lo, hi = self.current.prefix(start), self.current.prefix(stop)
        return [
            cut(items, int(a), int(b))
            for items, a, b in zip(self.items, lo.tolist(), hi.tolist(), strict=True)
        ]

    def _remaining(self, items: list[list[Item]], leg: Leg, depth: int) -> list[list[Item]]:
        """What is left of each source's ``items`` after ``leg`` (its streams' unread rows:
        the rest of the block each stopped in, and the rows after it)."""
        layout = leg.layout
        interleave = self.interleave(items, depth)
        layouts = source_layouts(layout, interleave.counts)
        left: list[list[Item]] = [[] for _ in items]
        for rank in range(leg.world_size):
            spans = stream_spans(
                interleave.total,
                rank=rank,
                world_size=leg.world_size,
                num_workers=leg.num_workers,
                layout=layout,
            )
            lengths = [b - a for a, b in spans]
            done = consumed(stream_batches(lengths, layout), leg.batches)
            for worker, (a, b) in enumerate(spans):
                read = min(done[worker] * layout.batch_size, b - a)
                if read >= b - a:
                    continue
                starts = interleave.prefix(a).tolist()
                reads = interleave.prefix(a + read).tolist()
                stops = interleave.prefix(b).tolist()
                for i, source_items in enumerate(items):
                    span = (starts[i], stops[i])
                    length, got = stops[i] - starts[i], reads[i] - starts[i]
                    if got >= length:
                        continue
                    key = {
                        "seed": layout.seed,
                        "epoch": self.epoch,
                        "stream": rank * leg.num_workers + worker,
                        "leg": depth,
                        "source": i,
                    }
                    partial, untouched = block_rest(source_items, span, got, layouts[i], key)
                    left[i].extend(partial)
                    if untouched < length:
                        lo, hi = span[0] + untouched, span[1]
                        left[i].append(
                            Deferred(hi - lo, functools.partial(cut, source_items, lo, hi))
                        )
        return left


@dataclass(frozen=True, eq=False)
class Mixture:
    """A mixture's sources as planning sees them: what a pass needs besides the layout.

    Attributes:
        chunk_rows: rows of each chunk of each source, in each source's plan order.
        quotas: rows of each source an epoch (`quotas`).
        mixing: ``"random"`` or ``"stratified"``.
    """

    chunk_rows: tuple[np.ndarray, ...]
    quotas: tuple[int, ...]
    mixing: Mixing

    def epoch(self, layout: Layout, epoch: int, legs: tuple[Leg, ...]) -> MixEpoch:
        """The rows a pass over ``epoch`` reads after ``legs``, under ``layout``."""
        return MixEpoch(self.chunk_rows, self.quotas, self.mixing, epoch, legs, layout)

    def spans(self, mix: MixEpoch, rank: Topology) -> list[tuple[int, int]]:
        """Positions ``[a, b)`` of the current leg's sequence each worker of ``rank`` reads:
        the streams of one source's epoch (`EqualStreams`), cut from the mixture's sequence."""
        return stream_spans(
            mix.total,
            rank=rank.rank,
            world_size=rank.world_size,
            num_workers=rank.num_workers,
            layout=mix.layout,
        )
