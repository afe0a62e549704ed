"""Where an epoch stands after some batches, and what is left of it, against a reference model.

The model is written out here, independently of ``resume``: DataLoader's order of batches (one
from each worker in turn, skipping finished workers), each stream's positions (its span of the
sequence, wrapping for padding) and output order (blocks, each permuted by its seeded key), and
so the rows each stream delivered in the first ``k`` batches of every rank. ``remaining`` must
be exactly what the old topology would still have read, and a new topology must deal it out
equally, every row once.
"""

from __future__ import annotations

import dataclasses
import itertools
import random
from collections import Counter
from collections.abc import Sequence

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.unit.planning.test_sequence import expand
from torch_dataloader_utils.planning import (
    REMAINDER_POLICIES,
    Deferred,
    Layout,
    Leg,
    Run,
    Topology,
    block_bounds,
    block_permutation,
    block_start,
    consumed,
    delivery_order,
    epoch_sequence,
    remaining,
    sequence_length,
    stream_batches,
    stream_runs,
    stream_spans,
)
from torch_dataloader_utils.stream.batches import cut_batches
from torch_dataloader_utils.stream.blocks import shuffled_blocks

SEED = 77
EPOCH = 3


# --- DataLoader's order -----------------------------------------------------------------------


def dataloader_order(counts: Sequence[int]) -> list[int]:
    """The worker of each batch: rounds, each worker with batches left gives one."""
    order: list[int] = []
    for r in range(max(counts, default=0)):
        order.extend(w for w, n in enumerate(counts) if n > r)
    return order


def delivered_by(counts: Sequence[int], batches: int) -> list[int]:
    taken = Counter(dataloader_order(counts)[:batches])
    return [taken[w] for w in range(len(counts))]


COUNT_VECTORS = [
    (),
    (0,),
    (5,),
    (0, 0, 0),
    (3, 3, 3),
    (3, 3, 2),
    (4, 0, 4),
    (0, 2, 0, 1),
    (1, 5, 2),
    (7, 1, 0, 7, 3),
    (10, 9, 9, 9),
    *itertools.product(range(4), repeat=3),
]


@pytest.mark.parametrize("counts", COUNT_VECTORS)
def test_consumed_follows_dataloader_order(counts):
    total = sum(counts)
    for k in range(total + 4):
        done = consumed(list(counts), k)
        assert done == delivered_by(counts, k), (counts, k)
        assert sum(done) == min(k, total)
        assert all(0 <= d <= n for d, n in zip(done, counts, strict=True))


@pytest.mark.parametrize("counts", COUNT_VECTORS)
def test_delivery_order_continues_dataloader_order(counts):
    order = dataloader_order(counts)
    assert list(delivery_order(counts, [0] * len(counts))) == order
    for k in range(sum(counts) + 2):
        assert list(delivery_order(counts, consumed(counts, k))) == order[k:], (counts, k)


def test_delivery_order_is_lazy():
    it = delivery_order([10**9, 10**9], [0, 0])
    assert list(itertools.islice(it, 5)) == [0, 1, 0, 1, 0]


def test_the_earlier_names_still_work():
    from torch_dataloader_utils import planning, state

    assert planning.round_robin is delivery_order
    assert planning.Iteration is planning.Pass is state.Iteration is state.Pass


# --- Layout and blocks ------------------------------------------------------------------------


def test_layout_batches():
    for rows, batch_size in itertools.product(range(30), range(1, 7)):
        keep = Layout(batch_size, False, 0, False, "drop", 8, 1)
        drop = Layout(batch_size, False, 0, True, "drop", 8, 1)
        assert keep.batches(rows) == len(range(0, rows, batch_size))
        assert drop.batches(rows) == rows // batch_size
        assert stream_batches([rows, 0, 1], keep) == [keep.batches(n) for n in (rows, 0, 1)]


def test_block_start_finds_the_block_of_a_row():
    for length, block_rows, first in itertools.product(range(25), range(1, 6), range(0, 5)):
        layout = Layout(2, True, 0, False, "drop", block_rows, first)
        plain = Layout(2, False, 0, False, "drop", block_rows, first)
        bounds = block_bounds(length, block_rows=block_rows, first_block_rows=first)
        for position in range(length + 3):
            assert block_start(length, position, plain) == (0, position)
            if position >= length:
                assert block_start(length, position, layout) == (0, position)
                continue
            index, start = block_start(length, position, layout)
            assert bounds[index][0] == start <= position < bounds[index][1]


# --- the model of one leg ---------------------------------------------------------------------


def output_order(positions: list[int], layout: Layout, *, stream: int, depth: int) -> list[int]:
    """A stream's positions in the order it yields them."""
    if not layout.shuffle:
        return list(positions)
    out: list[int] = []
    bounds = block_bounds(
        len(positions), block_rows=layout.block_rows, first_block_rows=layout.first_block_rows
    )
    for i, (a, b) in enumerate(bounds):
        perm = block_permutation(
            seed=layout.seed, epoch=EPOCH, stream=stream, block=i, n=b - a, leg=depth
        )
        out.extend(positions[a + int(j)] for j in perm)
    return out


def model_leg(seq: list[int], leg: Leg, depth: int) -> tuple[Counter, Counter, list[int]]:
    """What the leg's streams delivered and what they would still read (multisets of
    positions), and the batches each rank delivered."""
    total, layout, bs = len(seq), leg.layout, leg.layout.batch_size
    delivered: Counter = Counter()
    left: Counter = Counter()
    rank_batches = []
    for rank in range(leg.world_size):
        spans = stream_spans(
            total, rank=rank, world_size=leg.world_size, num_workers=leg.num_workers, layout=layout
        )
        streams = [[seq[p % total] for p in range(a, b)] for a, b in spans]
        counts = [
            len(s) // bs if layout.drop_last else -(-len(s) // bs) for s in streams
        ]  # batches of each stream
        done = delivered_by(counts, leg.batches)
        rank_batches.append(sum(done))
        for worker, positions in enumerate(streams):
            out = output_order(
                positions, layout, stream=rank * leg.num_workers + worker, depth=depth
            )
            read = done[worker] * bs
            delivered.update(out[:read])
            left.update(out[read:])
    return delivered, left, rank_batches


def rank_batch_counts(total: int, leg: Leg) -> list[int]:
    layout = leg.layout
    return [
        sum(
            stream_batches(
                [
                    b - a
                    for a, b in stream_spans(
                        total,
                        rank=r,
                        world_size=leg.world_size,
                        num_workers=leg.num_workers,
                        layout=layout,
                    )
                ],
                layout,
            )
        )
        for r in range(leg.world_size)
    ]


def make_leg(rng: random.Random, total: int, *, shuffle=None, remainder=None, when=None) -> Leg:
    """A random small leg over ``total`` rows; ``when`` picks its batches (start/mid/end/past)."""
    layout = Layout(
        batch_size=rng.randint(1, 5),
        shuffle=rng.choice((False, True)) if shuffle is None else shuffle,
        seed=rng.randint(0, 3),
        drop_last=rng.choice((False, True)),
        remainder=rng.choice(REMAINDER_POLICIES) if remainder is None else remainder,
        block_rows=rng.randint(1, 6),
        first_block_rows=rng.randint(0, 4),
    )
    leg = Leg(rng.randint(1, 3), rng.randint(1, 3), layout, 0)
    most = max(rank_batch_counts(total, leg), default=0)
    when = when or rng.choice(("start", "one", "mid", "mid", "end", "past"))
    batches = {
        "start": 0,
        "one": min(1, most),
        "mid": rng.randint(0, most),
        "end": most,
        "past": most + rng.randint(1, 3),
    }[when]
    return Leg(leg.world_size, leg.num_workers, layout, batches)


def check_leg(items: list, leg: Leg, depth: int, ctx: object) -> list:
    """``remaining`` is exactly what the model says the leg's streams still read."""
    seq = expand(items)
    delivered, left, rank_batches = model_leg(seq, leg, depth)
    rest = remaining(items, leg, epoch=EPOCH, depth=depth)
    assert sequence_length(rest) == sum(left.values()), ctx
    assert Counter(expand(rest)) == left, ctx
    # Delivered and left together are everything the leg's streams read.
    _, everything, _ = model_leg(seq, Leg(leg.world_size, leg.num_workers, leg.layout, 0), depth)
    assert delivered + left == everything, ctx
    assert sum(delivered.values()) <= leg.batches * leg.world_size * leg.layout.batch_size, ctx
    if leg.layout.remainder != "uneven":
        assert len(set(rank_batches)) <= 1, ctx  # every rank delivered as many batches
    return rest


# A spread of sizes: empty, tiny, primes, multiples of small numbers, and up to 60.
SIZES = [0, 1, 2, 3, 4, 5, 6, 7, 9, 11, 12, 13, 16, 17, 23, 24, 30, 31, 37, 47, 59, 60]


@pytest.mark.parametrize("remainder", REMAINDER_POLICIES)
@pytest.mark.parametrize("shuffle", [False, True], ids=["in-order", "shuffled"])
def test_remaining_is_what_the_old_streams_still_read(remainder, shuffle):
    rng = random.Random(f"one-{remainder}-{shuffle}")
    for total, when in itertools.product(SIZES, ("start", "one", "mid", "mid", "end", "past")):
        for _ in range(4):
            leg = make_leg(rng, total, shuffle=shuffle, remainder=remainder, when=when)
            check_leg([Run(0, total)] if total else [], leg, 0, (total, leg))
            assert expand(epoch_sequence(total, [leg], epoch=EPOCH)) == expand(
                remaining([Run(0, total)] if total else [], leg, epoch=EPOCH, depth=0)
            )


def test_remaining_after_no_batches_and_after_all():
    for total, ws, nw, remainder in itertools.product(
        (0, 1, 7, 10, 23), (1, 2, 3), (1, 2), REMAINDER_POLICIES
    ):
        layout = Layout(3, True, 1, False, remainder, 4, 1)
        items = [Run(0, total)] if total else []
        fresh = Leg(ws, nw, layout, 0)
        # Nothing delivered: every row the topology reads is left, none read twice but padding.
        rest = Counter(expand(remaining(items, fresh, epoch=0, depth=0)))
        if remainder == "uneven":
            assert rest == Counter(range(total))
        most = max(rank_batch_counts(total, fresh), default=0)
        for batches in (most, most + 1, 10 * most + 5):
            done = Leg(ws, nw, layout, batches)
            assert remaining(items, done, epoch=0, depth=0) == []


@pytest.mark.parametrize("remainder", REMAINDER_POLICIES)
def test_two_legs_leave_what_the_second_topology_still_reads(remainder):
    rng = random.Random(f"two-{remainder}")
    for total in SIZES:
        for _ in range(12):
            first = make_leg(rng, total, remainder=remainder)
            items = [Run(0, total)] if total else []
            rest = check_leg(items, first, 0, (total, first))
            second = make_leg(rng, sequence_length(rest))
            ctx = (total, first, second)
            rest2 = check_leg(rest, second, 1, ctx)
            chained = epoch_sequence(total, [first, second], epoch=EPOCH)
            assert Counter(expand(chained)) == Counter(expand(rest2)), ctx


def test_no_row_is_lost_or_repeated_across_legs():
    """With ``uneven`` and no ``drop_last`` every row of the epoch is read exactly once, however
    many topologies read it."""
    rng = random.Random("exact")
    for total in SIZES:
        for _ in range(8):
            legs: list[Leg] = []
            seen: Counter = Counter()
            items: list = [Run(0, total)] if total else []
            for depth in range(3):
                leg = make_leg(rng, sequence_length(items), remainder="uneven")
                leg = dataclasses.replace(
                    leg, layout=dataclasses.replace(leg.layout, drop_last=False)
                )
                delivered, _, _ = model_leg(expand(items), leg, depth)
                seen += delivered
                legs.append(leg)
                items = epoch_sequence(total, legs, epoch=EPOCH)
            seen.update(expand(items))
            assert seen == Counter(range(total)), (total, legs)


# --- the new topology deals out what is left --------------------------------------------------


def check_new_topology(items: list, topology: Leg, ctx: object) -> None:
    """Every remaining row is read by one new stream; ranks get equal rows (drop/pad)."""
    layout = topology.layout
    left = Counter(expand(items))
    total = sum(left.values())
    read: Counter = Counter()
    rank_rows, rank_batches = [], []
    for rank in range(topology.world_size):
        rows = batches = 0
        for worker in range(topology.num_workers):
            runs = stream_runs(
                items,
                Topology(rank, topology.world_size, worker, topology.num_workers),
                batch_size=layout.batch_size,
                drop_last=layout.drop_last,
                remainder=layout.remainder,
            )
            positions = expand(runs)
            read.update(positions)
            rows += len(positions)
            batches += layout.batches(len(positions))
        rank_rows.append(rows)
        rank_batches.append(batches)
    ws, bs = topology.world_size, layout.batch_size
    lost, extra = left - read, read - left
    if layout.remainder == "uneven":
        assert not extra, ctx
        assert sum(lost.values()) < (ws * bs if layout.drop_last else 1), ctx
        return
    assert len(set(rank_rows)) == 1 and len(set(rank_batches)) == 1, ctx
    if layout.drop_last:
        assert all(n % bs == 0 for n in rank_rows), ctx
    if layout.remainder == "drop":
        assert not extra, ctx
        assert sum(lost.values()) < ws + (ws * (bs - 1) if layout.drop_last else 0), ctx
    else:
        assert sum(extra.values()) < ws, ctx  # repeats: fewer than the ranks
        if not layout.drop_last:
            assert not lost, ctx
        else:
            assert sum(lost.values()) < ws * bs, ctx
    assert sum(read.values()) == sum(rank_rows) <= total + ws, ctx


@pytest.mark.parametrize("remainder", REMAINDER_POLICIES)
def test_a_new_topology_reads_the_rest_once_and_evenly(remainder):
    rng = random.Random(f"new-{remainder}")
    for total in SIZES:
        for _ in range(10):
            old = make_leg(rng, total)
            items = epoch_sequence(total, [old], epoch=EPOCH)
            new = make_leg(rng, sequence_length(items), remainder=remainder)
            check_new_topology(items, new, (total, old, new))
            # And on top of two legs.
            items2 = epoch_sequence(total, [old, new], epoch=EPOCH)
            newer = make_leg(rng, sequence_length(items2), remainder=remainder)
            check_new_topology(items2, newer, (total, old, new, newer))


def test_remaining_and_epoch_sequence_are_lazy():
    """No block permutation or old stream is computed until a new stream cuts it."""
    calls = []

    def make(run: Run):
        def go() -> list[Run]:
            calls.append((run.start, run.stop))
            return [run]

        return go

    items = [Deferred(10, make(Run(0, 10))), Deferred(10, make(Run(10, 20)))]
    layout = Layout(2, True, 0, False, "drop", 4, 1)
    rest = remaining(items, Leg(2, 2, layout, 1), epoch=0, depth=0)
    assert calls == []
    rest2 = remaining(rest, Leg(3, 1, layout, 1), epoch=0, depth=1)
    assert calls == []
    # Rank 0 of one worker out of a world of 4 touches only a part of the rest.
    first = stream_runs(rest2, Topology(0, 4), batch_size=2, drop_last=False, remainder="drop")
    assert sequence_length(first) == sequence_length(rest2) // 4
    assert calls and len(calls) < 4
    assert expand(first)


def test_epoch_sequence_without_legs_is_the_whole_epoch():
    assert epoch_sequence(0, [], epoch=0) == []
    (run,) = epoch_sequence(17, [], epoch=5)
    assert (run.start, run.stop, run.select) == (0, 17, None)


def test_block_permutations_are_keyed_by_leg():
    """After an elastic resume a stream shuffles differently from the old stream of its id."""
    layout = Layout(2, True, SEED, False, "uneven", 16, 16)
    leg0 = output_order(list(range(16)), layout, stream=0, depth=0)
    leg1 = output_order(list(range(16)), layout, stream=0, depth=1)
    assert sorted(leg0) == sorted(leg1) == list(range(16))
    assert leg0 != leg1


# --- the model's output order is the one the stream yields --------------------------------------


def read_stream(positions: list[int], layout: Layout, *, stream: int, depth: int, start: int):
    """Rows the stream yields from output row ``start`` on, through ``batching`` (resumed from
    the first row of the block that holds ``start``, as the dataset reads)."""
    length = len(positions)
    _, first = block_start(length, start, layout)
    column = pa.array(positions[first:], pa.int64())
    # Cut the read into uneven record batches: block boundaries must not depend on them.
    batches, at, size = [], 0, 1
    while at < len(column):
        batches.append(pa.record_batch([column.slice(at, size)], names=["p"]))
        at += size
        size = size % 4 + 1
    blocks = shuffled_blocks(
        batches, length, layout, epoch=EPOCH, stream=stream, leg=depth, start=start
    )
    out: list[list[int]] = []
    for batch, rows in cut_batches(blocks, layout.batch_size):
        values = batch.column(0)
        out.append((values if rows is None else values.take(pa.array(rows))).to_pylist())
    return out


def test_streams_yield_the_model_order_and_resume_at_any_batch():
    rng = np.random.default_rng(5)
    for length, bs, block_rows, first, shuffle, stream, depth in itertools.product(
        (0, 1, 5, 13, 24), (1, 3, 4), (1, 4, 7), (1, 3), (False, True), (0, 5), (0, 2)
    ):
        layout = Layout(bs, shuffle, SEED, False, "drop", block_rows, first)
        positions = sorted(rng.choice(1000, size=length, replace=False).tolist())
        expected = output_order(positions, layout, stream=stream, depth=depth)
        ctx = (length, layout, stream, depth)
        for done in range(-(-length // bs) + 1):
            start = min(done * bs, length)
            got = read_stream(positions, layout, stream=stream, depth=depth, start=start)
            assert [p for b in got for p in b] == expected[start:], (ctx, done)
            assert all(len(b) == bs for b in got[:-1]), ctx


# --- everything at once, at random --------------------------------------------------------------


@given(
    total=st.integers(0, 80),
    seed=st.integers(0, 2**16),
    legs=st.integers(1, 3),
)
@settings(max_examples=60, deadline=None)
def test_resume_properties(total, seed, legs):
    rng = random.Random(seed)
    items: list = [Run(0, total)] if total else []
    chain: list[Leg] = []
    for depth in range(legs):
        leg = make_leg(rng, sequence_length(items))
        items = check_leg(items, leg, depth, (total, chain, leg))
        chain.append(leg)
    assert Counter(expand(epoch_sequence(total, chain, epoch=EPOCH))) == Counter(expand(items))
    check_new_topology(items, make_leg(rng, sequence_length(items)), (total, chain))
