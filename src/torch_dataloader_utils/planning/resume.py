"""Where an epoch stands after some batches, and what is left of it (pure).

A rank's batches come from its streams (one per DataLoader worker) in a fixed order: round
robin over the workers, one batch each, skipping workers that have finished (DataLoader's own
order). So ``batches`` delivered by a rank fixes how many each stream delivered; the
stream's order (blocks, each permuted by a seeded key) fixes which rows those were. That makes
the state of an epoch a few integers, and resuming it a seek.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np

from .assign import rank_span, worker_span
from .layout import Layout
from .sequence import (
    Deferred,
    DocumentRest,
    Item,
    Run,
    cut,
    refuse_second_rest,
    sequence_length,
)
from .shuffle import BlockOrder, block_of

__all__ = [
    "Iteration",
    "Leg",
    "Pass",
    "block_rest",
    "block_start",
    "consumed",
    "epoch_sequence",
    "remaining",
    "delivery_order",
    "round_robin",
    "stream_batches",
    "stream_spans",
]


@dataclass(frozen=True, slots=True)
class Leg:
    """Part of an epoch read under one topology, before an elastic resume changed it.

    Attributes:
        world_size: ranks.
        num_workers: streams per rank (DataLoader workers; 1 when reading in-process).
        layout: the options the streams were cut and ordered with.
        batches: batches each rank delivered in this leg.
        skips: ranges of batch numbers after ``batches`` that the leg's ranks were not to
            deliver (`TabularDataLoader.skip`): their rows are left out of what comes after.
    """

    world_size: int
    num_workers: int
    layout: Layout
    batches: int
    skips: tuple[tuple[int, int], ...] = ()


@dataclass(frozen=True, slots=True)
class Pass:
    """One pass over an epoch, as the main process begins it.

    Attributes:
        epoch: the epoch.
        legs: earlier legs of this epoch (each an elastic resume's old topology).
        batches: batches this rank already delivered in the current leg (a resume).
        generation: counts passes in the main process; workers use it to tell whether their
            copy of this object describes the pass they are asked for.
        steps: ``(world_size, batch_size)`` whose batches a mixture's weights schedule counts
            in steps (``(0, 0)``: this pass's): the first pass's, kept in its state.
    """

    epoch: int
    legs: tuple[Leg, ...] = ()
    batches: int = 0
    generation: int = 0
    steps: tuple[int, int] = (0, 0)

    @property
    def resumed(self) -> bool:
        """Whether the pass starts anywhere but the beginning of a fresh epoch."""
        return bool(self.legs or self.batches)


Iteration = Pass  # the earlier name


def stream_spans(
    total: int, *, rank: int, world_size: int, num_workers: int, layout: Layout
) -> list[tuple[int, int]]:
    """Positions ``[start, stop)`` of the sequence that each worker of ``rank`` reads."""
    span = rank_span(
        total,
        rank=rank,
        world_size=world_size,
        batch_size=layout.batch_size,
        drop_last=layout.drop_last,
        remainder=layout.remainder,
    )
    return [
        worker_span(span, worker=w, num_workers=num_workers, batch_size=layout.batch_size)
        for w in range(num_workers)
    ]


def stream_batches(lengths: Sequence[int], layout: Layout) -> list[int]:
    """Batches of each stream, given the rows of each."""
    return [layout.batches(n) for n in lengths]


def consumed(counts: Sequence[int], batches: int) -> list[int]:
    """Batches each stream has delivered once the rank delivered ``batches`` (round robin)."""
    rounds_lo, rounds_hi = 0, max(counts, default=0)
    # The largest r whose first r rounds hold at most `batches` batches.
    while rounds_lo < rounds_hi:
        mid = (rounds_lo + rounds_hi + 1) // 2
        if sum(min(n, mid) for n in counts) <= batches:
            rounds_lo = mid
        else:
            rounds_hi = mid - 1
    done = [min(n, rounds_lo) for n in counts]
    left = batches - sum(done)
    for w, n in enumerate(counts):
        if left and n > rounds_lo:
            done[w] += 1
            left -= 1
    return done


def delivery_order(counts: Sequence[int], done: Sequence[int]) -> Iterator[int]:
    """The worker of each next batch, as DataLoader delivers them: the worker with the fewest
    delivered first, then the lowest id (``counts``: each worker's batches; ``done``: each
    one's delivered)."""
    done = list(done)
    while True:
        ready = [(d, w) for w, (d, n) in enumerate(zip(done, counts, strict=True)) if d < n]
        if not ready:
            return
        _, worker = min(ready)
        done[worker] += 1
        yield worker


round_robin = delivery_order  # the earlier name


def block_start(length: int, position: int, layout: Layout) -> tuple[int, int]:
    """The block that holds stream row ``position``: its index and first row.

    Without shuffling every row is its own block: reading restarts at ``position``.
    """
    if not layout.shuffle or position >= length:
        return 0, position
    index, start, _ = block_of(
        position, length, block_rows=layout.block_rows, first_block_rows=layout.first_block_rows
    )
    return index, start


def block_rest(
    items: Sequence[Item],
    span: tuple[int, int],
    read: int,
    order: BlockOrder,
    *,
    also: np.ndarray | None = None,
) -> tuple[list[Item], int]:
    """The unread rows of the block a stream stopped in, and where its untouched rows start.

    ``span``: the stream's positions of ``items``, delivered in ``order``. ``also``: rows
    after the first ``read`` that were delivered too (offsets from ``read`` in the order the
    stream delivers its rows: a token budget's rows of a group).
    """
    layout = order.layout
    length = span[1] - span[0]
    if read >= length or (not layout.shuffle and also is None):
        return [], read
    if not layout.shuffle:  # the rows after `read` in order, less those delivered
        stop = read + int(also.max()) + 1 if also is not None and len(also) else read
        offsets = np.setdiff1d(np.arange(stop - read), also if also is not None else [])
        kept: list[Item] = list(_rest_runs(items, span[0] + read, span[0] + stop, offsets))
        return kept, stop
    index, first, stop = order.block_of(read)
    if read == first and (also is None or not len(also)):
        return [], read
    if also is not None and len(also) and read + int(also.max()) >= stop:
        # A token budget's group that runs past the block (blocks set smaller than a group).
        return _blocks_rest(items, span, read, order, read + also)
    if layout.documents:  # which rows are left depends on the documents' lengths
        runs = cut(items, span[0] + first, span[0] + stop)
        if any(run.select is not None or run.rest is not None for run in runs):
            refuse_second_rest()
        ranges = tuple((run.start, run.stop) for run in runs)
        left = DocumentRest(order, index, read - first, 0, stop - read, ranges)
        return [Run(ranges[0][0], ranges[-1][1], rest=left)], stop
    skipped = 0 if also is None else len(also)
    # A partial, not a closure: an elastic resume keeps one per old stream and source, and a
    # closure's cells are that many more objects for the garbage collector to walk.
    block = (span[0] + first, span[0] + stop, read - first, index)
    rest = functools.partial(_block_rest, items, block, order, also)
    return [Deferred(stop - read - skipped, rest)], stop


def _block_rest(
    items: Sequence[Item],
    block: tuple[int, int, int, int],
    order: BlockOrder,
    also: np.ndarray | None,
) -> list[Run]:
    """The rows of a block (``(start, stop, read, index)``: positions ``[start, stop)``, block
    ``index`` of its stream) after its first ``read`` in the block's order, less ``also``."""
    start, stop, read, index = block
    unread = order.permutation(index, stop - start)[read:]
    if also is not None:
        unread = np.delete(unread, also)
    return _rest_runs(items, start, stop, np.sort(unread))


def _blocks_rest(
    items: Sequence[Item],
    span: tuple[int, int],
    read: int,
    order: BlockOrder,
    delivered: np.ndarray,
) -> tuple[list[Item], int]:
    """`block_rest` where the rows delivered after the first ``read`` (``delivered``: their
    offsets in the stream's order) reach past ``read``'s block: each block they touch, less
    its rows delivered, and where the untouched rows start."""
    left: list[Item] = []
    end = int(delivered.max()) + 1
    position = read
    while position < end:
        index, first, stop = order.block_of(position)
        before = np.arange(max(0, min(read, stop) - first))  # its rows delivered before `read`
        inside = delivered[(delivered >= first) & (delivered < stop)] - first
        gone = np.concatenate([before, inside])
        unread = np.delete(order.permutation(index, stop - first), gone)
        left.extend(_rest_runs(items, span[0] + first, span[0] + stop, np.sort(unread)))
        position = stop
    return left, position


def _rest_runs(items: Sequence[Item], start: int, stop: int, offsets: np.ndarray) -> list[Run]:
    """The rows at ``offsets`` (sorted, from ``start``) of positions ``[start, stop)``."""
    runs: list[Run] = []
    base = 0
    for run in cut(items, start, stop):
        mine = offsets[(offsets >= base) & (offsets < base + run.num_rows)] - base
        if len(mine):
            positions = run.positions(mine)
            runs.append(Run(int(positions[0]), int(positions[-1]) + 1, positions))
        base += run.num_rows
    return runs


def remaining(items: Sequence[Item], leg: Leg, *, epoch: int, depth: int) -> list[Item]:
    """What is left of the sequence ``items`` after ``leg``: each stream's unread rows.

    Args:
        items: the sequence the leg read (the epoch's, or what an earlier leg left).
        leg: the topology, layout and batches delivered per rank.
        epoch: the epoch (keys the block permutations).
        depth: the leg's index in the epoch (keys the block permutations).
    """
    layout = leg.layout
    total = sequence_length(items)
    left: list[Item] = []
    for rank in range(leg.world_size):
        spans = stream_spans(
            total, rank=rank, world_size=leg.world_size, num_workers=leg.num_workers, layout=layout
        )
        lengths = [b - a for a, b in spans]
        counts = stream_batches(lengths, layout)
        done = consumed(counts, leg.batches)
        skipped = skipped_batches(counts, leg)
        for worker, span in enumerate(spans):
            length = lengths[worker]
            read = min(done[worker] * layout.batch_size, length)
            if read >= length:
                continue
            stream = rank * leg.num_workers + worker
            order = BlockOrder(layout, length, epoch, stream, leg=depth)
            if skipped[worker]:  # the stream's rows, less those read and those skipped
                size = layout.batch_size
                gone = [np.arange(b * size, min((b + 1) * size, length)) for b in skipped[worker]]
                left.extend(unskipped(items, span, read, gone, order))
                continue
            partial, untouched = block_rest(items, span, read, order)
            left.extend(partial)
            if untouched < length:
                a, b = span[0] + untouched, span[0] + length
                left.append(Deferred(b - a, functools.partial(cut, items, a, b)))
    return left


def skipped_batches(counts: Sequence[int], leg: Leg) -> list[list[int]]:
    """The batches of each stream (of a rank with ``counts``) that ``leg.skips`` leaves out."""
    out: list[list[int]] = [[] for _ in counts]
    for first, stop in leg.skips:
        for batch in range(first, stop):
            done = consumed(counts, batch)
            ready = [(d, w) for w, (d, n) in enumerate(zip(done, counts, strict=True)) if d < n]
            if ready:
                _, worker = min(ready)
                out[worker].append(done[worker])
    return out


def unskipped(
    items: Sequence[Item],
    span: tuple[int, int],
    read: int,
    skipped: Sequence[np.ndarray],
    order: BlockOrder,
) -> list[Item]:
    """The rows of a stream (positions ``span`` of ``items``, delivered in ``order``) neither
    among its first ``read`` delivered nor ``skipped`` (offsets in the order the stream
    delivers its rows), in position order."""
    length = span[1] - span[0]
    offsets = np.unique(np.concatenate([np.arange(read), *skipped]))  # (delivered order)
    kept = np.setdiff1d(np.arange(length), order.delivered(offsets))
    return list(_rest_runs(items, span[0], span[1], kept))


def epoch_sequence(total: int, legs: Sequence[Leg], *, epoch: int) -> list[Item]:
    """The sequence the current leg of ``epoch`` reads: all ``total`` rows, less earlier legs'."""
    items: list[Item] = [Run(0, total)] if total else []
    for depth, leg in enumerate(legs):
        items = remaining(items, leg, epoch=epoch, depth=depth)
    return items
