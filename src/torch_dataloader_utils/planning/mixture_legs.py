"""A mixture's legs (pure): how its sequence is cut into streams, each source's blocks, and what
an elastic resume leaves of each source (`leg_rest`).

A leg's streams are cut from the mixture's sequence as one source's are; each stream's rows of
a source are the ranges of that source's items its positions hold (one range, or one a phase
in an epoch whose weights change: `phases.PhasedInterleave.ranges`). What the leg left of them
is worked out as for one source (`resume.block_rest`, `resume.unskipped`), and, in an epoch
whose weights change, so is how many of each phase's positions each source still holds.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Callable, Sequence
from typing import NamedTuple

import numpy as np

from .interleave import source_ranges
from .layout import Layout
from .phases import Labels, PhaseCounts, PhasedInterleave
from .resume import (
    Leg,
    block_rest,
    consumed,
    skipped_batches,
    stream_batches,
    stream_spans,
    unskipped,
)
from .sequence import Deferred, Item, cut
from .shuffle import BlockOrder

__all__ = ["leg_rest", "mixture_spans", "source_layouts"]


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


def mixture_spans(
    total: int, *, rank: int, world_size: int, num_workers: int, layout: Layout
) -> list[tuple[int, int]]:
    """`stream_spans` of a mixture's sequence: a packed mixture's cut at whole sequences
    (``layout.seq_tokens`` positions), which are each one source's."""
    turn = max(1, layout.seq_tokens)
    if turn == 1:
        return stream_spans(
            total, rank=rank, world_size=world_size, num_workers=num_workers, layout=layout
        )
    turns = dataclasses.replace(layout, batch_size=layout.batch_size // turn)
    spans = stream_spans(
        total // turn, rank=rank, world_size=world_size, num_workers=num_workers, layout=turns
    )
    return [(a * turn, b * turn) for a, b in spans]


def leg_rest(
    interleave_of: Callable[..., Labels],
    items: list[list[Item]],
    phases: PhaseCounts,
    leg: Leg,
    depth: int,
    *,
    epoch: int,
) -> tuple[list[list[Item]], PhaseCounts]:
    """What is left of each source's ``items`` after ``leg`` (its streams' unread rows: the
    rest of the block each stopped in, and the rows after it, less its skipped batches'), and
    of ``phases`` (each phase's positions of each source, in an epoch whose weights change).

    ``interleave_of(items, depth, phases, readers)``: the leg's interleave (`MixEpoch`).
    """
    layout = leg.layout
    size = layout.batch_size
    interleave = interleave_of(items, depth, phases, (leg.world_size, leg.num_workers, layout))
    layouts = source_layouts(layout, interleave.counts)
    left: list[list[Item]] = [[] for _ in items]
    unread = None if phases is None else np.zeros((len(phases), len(items)), np.int64)
    streams = _unfinished(leg, interleave.total)
    # Each stream's prefix counts at its start, where it stopped and its end, all at once.
    marks = sorted({x for s in streams for x in (s.start, s.start + s.read, s.stop)})
    at = dict(zip(marks, interleave.prefixes(marks).tolist(), strict=True))
    for stream in streams:
        a, read, b = stream.start, stream.read, stream.stop
        got = [y - x for x, y in zip(at[a], at[a + read], strict=True)]
        # The rows of each source in the stream's skipped batches (`Leg.skips`), counted
        # in the order the stream delivers that source's rows.
        gone = _source_offsets(interleave, a, b, stream.skipped, size)
        if unread is not None:
            assert isinstance(interleave, PhasedInterleave)
            unread += _unread(interleave, (a, a + read, b), stream.skipped, size)
        ranges = (
            interleave.ranges(a, b)  # (one range a phase)
            if isinstance(interleave, PhasedInterleave)
            else source_ranges(at[a], at[b])
        )
        for i, parts in enumerate(ranges):
            source_items, span = _stream_rows(items[i], parts)
            length = span[1] - span[0]
            if got[i] >= length:
                continue
            order = BlockOrder(layouts[i], length, epoch, stream.stream, leg=depth, source=i)
            if gone[i]:
                left[i].extend(unskipped(source_items, span, got[i], gone[i], order))
                continue
            partial, untouched = block_rest(source_items, span, got[i], order)
            left[i].extend(partial)
            if untouched < length:
                lo, hi = span[0] + untouched, span[1]
                left[i].append(Deferred(hi - lo, functools.partial(cut, source_items, lo, hi)))
    return left, None if unread is None else unread.tolist()


class _OldStream(NamedTuple):
    stream: int  # rank * num_workers + worker
    start: int  # its span of the leg's sequence, [start, stop)
    read: int  # positions it delivered
    stop: int
    skipped: list[int]  # its batches `Leg.skips` leaves out


def _unfinished(leg: Leg, total: int) -> list[_OldStream]:
    """The streams of ``leg`` (over a sequence of ``total`` positions) that left rows."""
    size = leg.layout.batch_size
    out = []
    for rank in range(leg.world_size):
        spans = mixture_spans(
            total,
            rank=rank,
            world_size=leg.world_size,
            num_workers=leg.num_workers,
            layout=leg.layout,
        )
        counts = stream_batches([b - a for a, b in spans], leg.layout)
        done = consumed(counts, leg.batches)
        skipped = skipped_batches(counts, leg)
        for worker, (a, b) in enumerate(spans):
            read = min(done[worker] * size, b - a)
            if read < b - a:
                stream = rank * leg.num_workers + worker
                out.append(_OldStream(stream, a, read, b, skipped[worker]))
    return out


def _stream_rows(
    items: list[Item], ranges: Sequence[tuple[int, int]]
) -> tuple[list[Item], tuple[int, int]]:
    """A stream's rows of a source as items and the span of them it reads: the source's
    items and the one range, or (one range a phase) each range as an item of its own."""
    if len(ranges) <= 1:
        return items, ranges[0] if ranges else (0, 0)
    parts: list[Item] = [Deferred(b - a, functools.partial(cut, items, a, b)) for a, b in ranges]
    return parts, (0, sum(b - a for a, b in ranges))


def _source_offsets(
    interleave: Labels, start: int, stop: int, batches: Sequence[int], batch_size: int
) -> list[list[np.ndarray]]:
    """Each source's rows in ``batches`` of the stream at positions ``[start, stop)``, as
    offsets in the order the stream delivers that source's rows."""
    out: list[list[np.ndarray]] = [[] for _ in interleave.counts]
    if not batches:
        return out
    first = interleave.prefix(start)
    for batch in batches:
        lo = interleave.prefix(start + batch * batch_size) - first
        hi = interleave.prefix(min(start + (batch + 1) * batch_size, stop)) - first
        for i, (a, b) in enumerate(zip(lo.tolist(), hi.tolist(), strict=True)):
            if b > a:
                out[i].append(np.arange(a, b))
    return out


def _unread(
    interleave: PhasedInterleave,
    stream: tuple[int, int, int],
    skipped: Sequence[int],
    batch_size: int,
) -> np.ndarray:
    """Each phase's positions of each source that a stream (``(start, read to, stop)``) did
    not deliver, its skipped batches' left out."""
    start, at, stop = stream
    cuts = sorted(
        (start + b * batch_size, min(start + (b + 1) * batch_size, stop)) for b in skipped
    )
    out = np.zeros((len(interleave.phases), len(interleave.counts)), np.int64)
    for lo, hi in _between(at, stop, cuts):
        turn = interleave.turn
        for _, phase, first, last in interleave.ranges_by_stretch(lo // turn, hi // turn):
            out[phase] += last - first
    return out


def _between(start: int, stop: int, holes: Sequence[tuple[int, int]]) -> list[tuple[int, int]]:
    """``[start, stop)`` less the sorted ``holes``."""
    out, at = [], start
    for a, b in holes:
        if a > at:
            out.append((at, min(a, stop)))
        at = max(at, b)
    if at < stop:
        out.append((at, stop))
    return [(a, b) for a, b in out if b > a]
