"""Mixtures: several sources in one epoch, each with its quota of rows (pure).

The model, for sources ``0..k-1`` (docs/concepts/mixtures.md, ADR 0013):

- Source ``i`` delivers ``q_i`` rows an epoch (`quotas`: ``epoch_rows`` split by the weights,
  largest remainders, so they add up).
- Its rows come from an endless sequence of passes over it: pass ``p`` is all its chunks in the
  order ``(seed, source, p)`` fixes. Epoch ``e`` reads positions ``[e*q_i, (e+1)*q_i)`` of that
  sequence (`SourceEpoch`): a source smaller than its quota repeats, all of its rows before any
  row twice; a larger one goes on next epoch where it stopped. Nothing is kept between epochs:
  the epoch number says where each source stands.
- The epoch's global sequence interleaves the sources (`interleave.Interleave`): ``R =
  sum(q)`` positions, each a row of one source, the sources in proportion all along it. The
  streams cut it exactly as they cut one source's epoch: equal spans per rank, batch-aligned
  spans per worker. A stream's span ``[a, b)`` holds rows ``[P_i(a), P_i(b))`` of each
  source's sequence (``P``: the interleave's prefix counts), so each source's rows of a stream
  are contiguous and is read, shuffled in blocks and resumed as a one-source stream is.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property

import numpy as np

from ..errors import InvalidArgumentError
from .interleave import Interleave, Mixing
from .layout import Layout
from .mixture_legs import leg_rest, mixture_spans, source_layouts
from .phases import Labels, PhaseCounts, PhasedInterleave, Tiling, turn_layout
from .resume import Leg
from .schedule import EpochPhases, Schedule, phase_split
from .sequence import Item, Run, cut, sequence_length
from .shuffle import source_order
from .strategy import EpochRows
from .topology import Topology

__all__ = [
    "MixEpoch",
    "Mixture",
    "SourceEpoch",
    "mixture_spans",
    "quotas",
    "source_layouts",
]


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


@dataclass(frozen=True, eq=False)
class SourceEpoch(EpochRows):
    """The rows source ``source`` delivers in an epoch: positions ``[epoch*quota,
    (epoch+1)*quota)`` of its passes concatenated.

    ``order`` and ``rows`` list the chunks of the passes the epoch touches, in order (the
    first leg's seed and shuffle fix it); the epoch's rows are one run of them (`sequence`). What
    is left of them after elastic resumes is worked out by the mixture (`MixEpoch.items`).
    """

    source: int = 0
    quota: int = 0
    offset: int | None = None  # (a weights schedule's: rows delivered before the epoch)

    @property
    def start(self) -> int:
        """The epoch's first position in the source's passes concatenated."""
        return self.epoch * self.quota if self.offset is None else self.offset

    @cached_property
    def _passes(self) -> tuple[int, int, int]:
        """First pass the epoch touches, one past the last, and the source's rows."""
        total = int(np.sum(np.asarray(self.chunk_rows, dtype=np.int64)))
        if not self.quota or not total:
            return 0, 0, total
        start = self.start
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
    def sequence(self) -> list[Item]:
        """The epoch's rows: one run of the concatenated passes (none for a zero quota)."""
        first, _, total = self._passes
        if not self.quota:
            return []
        start = self.start - first * total
        return [Run(start, start + self.quota)]


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
        phases: a weights schedule's phases of the epoch (`schedule.EpochPhases`): then the
            quotas and where each source begins are theirs.
        readers: ``(world_size, num_workers)`` of the current leg (where phases are cut).
    """

    chunk_rows: tuple[np.ndarray, ...]
    quotas: tuple[int, ...]
    mixing: Mixing
    epoch: int
    legs: tuple[Leg, ...]
    layout: Layout
    phases: EpochPhases | None = None
    readers: tuple[int, int] = (1, 1)

    @property
    def first(self) -> Layout:
        """The first leg's layout: its seed and shuffle fix the epoch's orders."""
        return self.legs[0].layout if self.legs else self.layout

    @cached_property
    def sources(self) -> tuple[SourceEpoch, ...]:
        """Each source's epoch (its chunk order over the passes the epoch touches)."""
        # (With the legs: a source's chunk order is its first leg's, whatever layout it is
        # read with now.)
        phases = self.phases
        quotas = self.quotas if phases is None else phases.quotas
        return tuple(
            SourceEpoch(
                rows,
                self.epoch,
                self.legs,
                self.layout,
                source=i,
                quota=q,
                offset=None if phases is None else phases.offsets[i],
            )
            for i, (rows, q) in enumerate(zip(self.chunk_rows, quotas, strict=True))
        )

    @property
    def changes(self) -> bool:
        """Whether the weights change inside the epoch (a schedule's)."""
        return self.phases is not None and bool(self.phases.bounds)

    def interleave(
        self,
        items: Sequence[Sequence[Item]],
        depth: int,
        phases: PhaseCounts = None,
        readers: tuple[int, int, Layout] | None = None,
    ) -> Labels:
        """The interleave of leg ``depth``, whose sequence holds ``items`` of each source
        (``phases``: in an epoch whose weights change, each phase's positions of each source,
        cut as ``readers``, ``(world_size, num_workers, layout)``, read them; default: the
        current leg's)."""
        turn = max(1, self.layout.seq_tokens)  # (a packed mixture's sequences: one source each)
        key = {"seed": self.first.seed, "epoch": self.epoch, "leg": depth, "turn": turn}
        if phases is None:
            return Interleave([sequence_length(x) for x in items], self.mixing, **key)
        world_size, num_workers, layout = readers or (*self.readers, self.layout)
        totals = [sum(c) // turn for c in phases]
        tiling = Tiling(sum(totals), world_size, num_workers, turn_layout(layout))
        bounds = list(itertools.accumulate(totals))[:-1]
        return PhasedInterleave(tiling.phase_runs(bounds), phases, self.mixing, **key)

    @cached_property
    def _legs(self) -> tuple[list[list[Item]], PhaseCounts]:
        """What the current leg reads of each source's epoch, and (an epoch whose weights
        change) how many of each phase's positions each source holds."""
        items: list[list[Item]] = [list(s.sequence) for s in self.sources]
        phases = None
        if self.phases is not None and self.phases.bounds:
            phases = [list(c) for c in self.phases.counts]
        for depth, leg in enumerate(self.legs):
            items, phases = leg_rest(self.interleave, items, phases, leg, depth, epoch=self.epoch)
        return items, phases

    @property
    def items(self) -> list[list[Item]]:
        """What the current leg reads of each source's epoch."""
        return self._legs[0]

    @cached_property
    def current(self) -> Labels:
        """The current leg's interleave."""
        return self.interleave(self.items, len(self.legs), self._legs[1])

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

    def source_runs(self, start: int, stop: int) -> list[list[Run]]:
        """The runs of each source's sequence that positions ``[start, stop)`` of the current
        leg's sequence hold."""
        ranges = self.current.ranges(start, stop)
        return [
            [run for a, b in parts for run in cut(items, a, b)]
            for items, parts in zip(self.items, ranges, strict=True)
        ]


@dataclass(frozen=True, eq=False)
class Mixture:
    """A mixture's sources as planning sees them: what a pass needs besides the layout.

    Attributes:
        chunk_rows: rows of each chunk of each source, in each source's plan order.
        quotas: rows of each source an epoch (`quotas`; a schedule's: its first weights').
        mixing: ``"random"`` or ``"stratified"``.
        schedule: the weights by step (`schedule.Schedule`), if any.
    """

    chunk_rows: tuple[np.ndarray, ...]
    quotas: tuple[int, ...]
    mixing: Mixing
    schedule: Schedule | None = None

    def epoch(
        self,
        layout: Layout,
        epoch: int,
        legs: tuple[Leg, ...],
        *,
        readers: tuple[int, int] = (1, 1),
        steps: tuple[int, int] = (1, 0),
    ) -> MixEpoch:
        """The rows a pass over ``epoch`` reads after ``legs``, under ``layout``, by
        ``readers`` (``(world_size, num_workers)``); ``steps``: ``(world_size, batch_size)``
        a schedule's steps count batches of (batch size 0: the layout's)."""
        phases = None
        if self.schedule is not None:
            phases = self._phases(legs[0].layout if legs else layout, epoch, steps)
        return MixEpoch(
            self.chunk_rows, self.quotas, self.mixing, epoch, legs, layout, phases, readers
        )

    def _phases(self, layout: Layout, epoch: int, steps: tuple[int, int]) -> EpochPhases:
        assert self.schedule is not None
        turn = max(1, layout.seq_tokens)
        world_size, batch_size = steps
        counted = turn_layout(layout)
        if batch_size:
            counted = dataclasses.replace(counted, batch_size=batch_size // turn)
        total = sum(self.quotas) // turn
        tiling = Tiling(total, world_size, 1, counted)
        rows = [int(np.sum(r)) // turn for r in self.chunk_rows]
        return EpochPhases.of(
            self.schedule,
            epoch,
            total=total,
            steps=sum(tiling.ranks[0].counts),
            before=tiling.before,
            split=phase_split(self.schedule, rows, quotas),
            turn=turn,
        )

    def spans(self, mix: MixEpoch, rank: Topology) -> list[tuple[int, int]]:
        """Positions ``[a, b)`` of the current leg's sequence each worker of ``rank`` reads:
        the streams of one source's epoch (`EqualStreams`), cut from the mixture's sequence."""
        return mixture_spans(
            mix.total,
            rank=rank.rank,
            world_size=rank.world_size,
            num_workers=rank.num_workers,
            layout=mix.layout,
        )
