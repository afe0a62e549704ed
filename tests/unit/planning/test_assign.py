"""The assignment of rows to streams (docs/concepts/model.md), checked by brute force.

Every small plan x topology x epoch x batch size x remainder policy is laid out, expanded to
``(chunk, row)`` ids, and checked against the reference model: one global row sequence per epoch,
cut into equal rank spans, each cut into contiguous, batch-aligned worker streams.
"""

from __future__ import annotations

import itertools
from collections import Counter
from collections.abc import Sequence
from functools import cache

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from torch_dataloader_utils.errors import InvalidArgumentError
from torch_dataloader_utils.planning import (
    REMAINDER_POLICIES,
    Piece,
    Topology,
    assign_stream,
    chunk_order,
    rank_span,
    span_pieces,
    worker_span,
)

SEED = 1234

# Rows of each chunk, in plan order: zero-row chunks, a single chunk, all-empty, no chunks at all.
PLANS: dict[str, tuple[int, ...]] = {
    "no-chunks": (),
    "one-empty": (0,),
    "all-empty": (0, 0, 0),
    "one-row": (1,),
    "single": (7,),
    "with-empty": (3, 0, 5),
    "ones": (1, 1, 1, 1, 1),
    "mixed": (2, 9, 0, 4, 1, 6),
    "equal": (5, 5, 5, 5),
    "empty-ends": (0, 13, 0),
    "many": (4, 3, 8, 1, 0, 2, 7, 5),
}
WORLD_SIZES = range(1, 5)
NUM_WORKERS = range(1, 5)
BATCH_SIZES = range(1, 6)
EPOCHS = range(3)

Row = tuple[int, int]
# layout[rank][worker] is the list of pieces of that stream.
Layout = tuple[tuple[tuple[Piece, ...], ...], ...]


def rows_of(pieces: Sequence[Piece]) -> list[Row]:
    """Expand pieces to ``(chunk, row)`` ids, in reading order."""
    return [(p.chunk, r) for p in pieces for r in range(p.start, p.stop)]


def ceil_div(a: int, b: int) -> int:
    return -(-a // b)


@cache
def layout(
    chunk_rows: tuple[int, ...],
    world_size: int,
    num_workers: int,
    epoch: int,
    shuffle: bool,
    batch_size: int,
    drop_last: bool,
    remainder: str,
    seed: int = SEED,
) -> Layout:
    """Every stream of a job. Cached: the functions are pure, and many tests read one layout."""
    return tuple(
        tuple(
            tuple(
                assign_stream(
                    chunk_rows,
                    Topology(rank, world_size, worker, num_workers),
                    epoch=epoch,
                    seed=seed,
                    shuffle=shuffle,
                    batch_size=batch_size,
                    drop_last=drop_last,
                    remainder=remainder,  # type: ignore[arg-type]
                )
            )
            for worker in range(num_workers)
        )
        for rank in range(world_size)
    )


def rank_rows(streams: Sequence[Sequence[Piece]]) -> list[Row]:
    """A rank's rows: its worker streams concatenated in worker order."""
    return [row for pieces in streams for row in rows_of(pieces)]


def global_rows(chunk_rows: Sequence[int], *, epoch: int, shuffle: bool) -> list[Row]:
    """The reference global row sequence: every chunk's rows, chunks in ``chunk_order``."""
    order = chunk_order(len(chunk_rows), seed=SEED, epoch=epoch, shuffle=shuffle)
    return [(int(c), r) for c in order for r in range(chunk_rows[c])]


def expected_concatenation(
    chunk_rows: Sequence[int], *, world_size: int, epoch: int, shuffle: bool, remainder: str
) -> list[Row]:
    """What all ranks read, in rank order, before ``drop_last``, by the policy's definition."""
    seq = global_rows(chunk_rows, epoch=epoch, shuffle=shuffle)
    n = len(seq)
    if remainder == "uneven":
        return seq
    if remainder == "drop":
        return seq[: n - n % world_size]
    assert remainder == "pad"
    padded = world_size * ceil_div(n, world_size)
    return [seq[p % n] for p in range(padded)] if n else []


def configs(
    *, remainders: Sequence[str] = REMAINDER_POLICIES, drop_lasts: Sequence[bool] = (False, True)
):
    """Every small configuration, as keyword arguments of ``layout`` (less the plan)."""
    for (
        world_size,
        num_workers,
        batch_size,
        epoch,
        shuffle,
        drop_last,
        remainder,
    ) in itertools.product(
        WORLD_SIZES,
        NUM_WORKERS,
        BATCH_SIZES,
        EPOCHS,
        (False, True),
        drop_lasts,
        remainders,
    ):
        yield {
            "world_size": world_size,
            "num_workers": num_workers,
            "batch_size": batch_size,
            "epoch": epoch,
            "shuffle": shuffle,
            "drop_last": drop_last,
            "remainder": remainder,
        }


plans = pytest.mark.parametrize("chunk_rows", list(PLANS.values()), ids=list(PLANS))
remainders = pytest.mark.parametrize("remainder", REMAINDER_POLICIES)


# --- checks shared by the exhaustive tests and the property test --------------------------------


def check_pieces_well_formed(chunk_rows: Sequence[int], pieces: Sequence[Piece], ctx: object):
    for i, p in enumerate(pieces):
        assert 0 <= p.chunk < len(chunk_rows), ctx
        assert 0 <= p.start < p.stop <= chunk_rows[p.chunk], (ctx, p)
        assert p.num_rows == p.stop - p.start
        # Only the ends of a stream may cut inside a chunk.
        if i > 0:
            assert p.start == 0, (ctx, i, pieces)
        if i < len(pieces) - 1:
            assert p.stop == chunk_rows[p.chunk], (ctx, i, pieces)


def check_reference_model(chunk_rows: tuple[int, ...], cfg: dict, lay: Layout):
    """Ranks concatenate to the policy's sequence; ``drop_last`` keeps whole batches of each."""
    untrimmed = layout(chunk_rows, **{**cfg, "drop_last": False})
    expected = expected_concatenation(
        chunk_rows,
        world_size=cfg["world_size"],
        epoch=cfg["epoch"],
        shuffle=cfg["shuffle"],
        remainder=cfg["remainder"],
    )
    got = [row for streams in untrimmed for row in rank_rows(streams)]
    assert got == expected, cfg
    if cfg["drop_last"]:
        bs = cfg["batch_size"]
        for streams, full in zip(lay, untrimmed, strict=True):
            whole = rank_rows(full)
            assert rank_rows(streams) == whole[: len(whole) // bs * bs], cfg


def check_batch_alignment(lay: Layout, batch_size: int, ctx: object):
    for streams in lay:
        lengths = [len(rows_of(pieces)) for pieces in streams]
        nonempty = [i for i, n in enumerate(lengths) if n]
        for i in nonempty[:-1]:
            assert lengths[i] % batch_size == 0, (ctx, lengths)
        batches = [ceil_div(n, batch_size) for n in lengths]
        assert max(batches) - min(batches) <= 1, (ctx, lengths)


def check_equal_batches(lay: Layout, batch_size: int, drop_last: bool, ctx: object):
    per_rank_rows = {len(rank_rows(streams)) for streams in lay}
    assert len(per_rank_rows) == 1, (ctx, per_rank_rows)
    (rows,) = per_rank_rows
    if drop_last:
        assert rows % batch_size == 0, ctx
    per_rank_batches = {
        sum(ceil_div(len(rows_of(pieces)), batch_size) for pieces in streams) for streams in lay
    }
    assert per_rank_batches == {ceil_div(rows, batch_size)}, (ctx, per_rank_batches)


# --- assign_stream, every small configuration -------------------------------------------------


@plans
@remainders
def test_pieces_are_well_formed(chunk_rows, remainder):
    for cfg in configs(remainders=[remainder]):
        for rank, streams in enumerate(layout(chunk_rows, **cfg)):
            for worker, pieces in enumerate(streams):
                check_pieces_well_formed(chunk_rows, pieces, (cfg, rank, worker))


@plans
@remainders
def test_ranks_follow_the_reference_model(chunk_rows, remainder):
    for cfg in configs(remainders=[remainder]):
        check_reference_model(chunk_rows, cfg, layout(chunk_rows, **cfg))


@plans
@pytest.mark.parametrize("remainder", ["drop", "uneven"])
def test_streams_are_disjoint(chunk_rows, remainder):
    for cfg in configs(remainders=[remainder]):
        everything = [row for streams in layout(chunk_rows, **cfg) for row in rank_rows(streams)]
        assert len(everything) == len(set(everything)), cfg


@plans
def test_uneven_reads_every_row_exactly_once(chunk_rows):
    every_row = sorted((c, r) for c, n in enumerate(chunk_rows) for r in range(n))
    for cfg in configs(remainders=["uneven"], drop_lasts=[False]):
        lay = layout(chunk_rows, **cfg)
        assert sorted(row for streams in lay for row in rank_rows(streams)) == every_row, cfg
        # The first total % world_size ranks carry the extra rows.
        counts = [len(rank_rows(streams)) for streams in lay]
        assert max(counts) - min(counts) <= 1, (cfg, counts)
        assert counts == sorted(counts, reverse=True), (cfg, counts)


@plans
def test_drop_reads_all_but_the_remainder(chunk_rows):
    total = sum(chunk_rows)
    every_row = {(c, r) for c, n in enumerate(chunk_rows) for r in range(n)}
    for cfg in configs(remainders=["drop"]):
        world_size, batch_size = cfg["world_size"], cfg["batch_size"]
        lay = layout(chunk_rows, **cfg)
        per_rank = [rank_rows(streams) for streams in lay]
        read = {row for rows in per_rank for row in rows}
        assert read <= every_row, cfg
        share = total // world_size
        if cfg["drop_last"]:
            share -= share % batch_size
        assert [len(rows) for rows in per_rank] == [share] * world_size, cfg
        if not cfg["drop_last"]:
            assert len(read) == total - total % world_size, cfg


@plans
def test_pad_repeats_rows_only_by_the_padding(chunk_rows):
    total = sum(chunk_rows)
    every_row = {(c, r) for c, n in enumerate(chunk_rows) for r in range(n)}
    for cfg in configs(remainders=["pad"], drop_lasts=[False]):
        world_size = cfg["world_size"]
        padded = world_size * ceil_div(total, world_size)
        lay = layout(chunk_rows, **cfg)
        counts = Counter(row for streams in lay for row in rank_rows(streams))
        assert set(counts) == every_row, cfg  # every row at least once
        assert sum(counts.values()) == padded, cfg
        assert sum(n - 1 for n in counts.values()) == padded - total, cfg
        if counts:
            # Wrapping spreads repeats evenly; with fewer padding rows than rows, at most twice.
            assert max(counts.values()) - min(counts.values()) <= 1, cfg
            if padded - total <= total:
                assert max(counts.values()) <= 2, cfg


@plans
@pytest.mark.parametrize("remainder", ["drop", "pad"])
def test_every_rank_gets_the_same_number_of_batches(chunk_rows, remainder):
    for cfg in configs(remainders=[remainder]):
        lay = layout(chunk_rows, **cfg)
        check_equal_batches(lay, cfg["batch_size"], cfg["drop_last"], cfg)


@plans
@remainders
def test_worker_streams_are_batch_aligned(chunk_rows, remainder):
    for cfg in configs(remainders=[remainder]):
        check_batch_alignment(layout(chunk_rows, **cfg), cfg["batch_size"], cfg)


@plans
@remainders
def test_rank_rows_do_not_depend_on_num_workers(chunk_rows, remainder):
    for cfg in configs(remainders=[remainder]):
        if cfg["num_workers"] == 1:
            continue
        one_worker = layout(chunk_rows, **{**cfg, "num_workers": 1})
        lay = layout(chunk_rows, **cfg)
        for rank in range(cfg["world_size"]):
            assert rank_rows(lay[rank]) == rank_rows(one_worker[rank]), (cfg, rank)


@pytest.mark.parametrize("chunk_rows", [PLANS["mixed"], PLANS["many"]], ids=["mixed", "many"])
def test_assignment_is_deterministic(chunk_rows):
    for cfg in configs():
        if cfg["batch_size"] not in (1, 3):
            continue
        for rank, worker in itertools.product(range(cfg["world_size"]), range(cfg["num_workers"])):
            fresh = assign_stream(
                list(chunk_rows),
                Topology(rank, cfg["world_size"], worker, cfg["num_workers"]),
                epoch=cfg["epoch"],
                seed=SEED,
                shuffle=cfg["shuffle"],
                batch_size=cfg["batch_size"],
                drop_last=cfg["drop_last"],
                remainder=cfg["remainder"],
            )
            assert tuple(fresh) == layout(chunk_rows, **cfg)[rank][worker], cfg


def chunk_sequence(lay: Layout) -> list[int]:
    """Chunks in the order the job reads them (a chunk cut between streams counted once)."""
    seq = [p.chunk for streams in lay for pieces in streams for p in pieces]
    return [c for i, c in enumerate(seq) if i == 0 or seq[i - 1] != c]


def test_shuffle_changes_the_chunk_order_between_epochs_and_seeds():
    chunk_rows = PLANS["many"]
    nonempty = [c for c, n in enumerate(chunk_rows) if n]
    orders = set()
    for epoch, seed in itertools.product(range(4), range(4)):
        lay = layout(chunk_rows, 2, 3, epoch, True, 2, False, "uneven", seed)
        seq = chunk_sequence(lay)
        assert sorted(seq) == nonempty
        orders.add(tuple(seq))
    assert len(orders) == 16


@plans
def test_no_shuffle_reads_in_plan_order_whatever_the_epoch_and_seed(chunk_rows):
    nonempty = [c for c, n in enumerate(chunk_rows) if n]
    first = layout(chunk_rows, 3, 2, 0, False, 2, False, "uneven", 0)
    assert chunk_sequence(first) == nonempty
    for epoch, seed in itertools.product(range(3), (0, 1, 99)):
        assert layout(chunk_rows, 3, 2, epoch, False, 2, False, "uneven", seed) == first


def test_shuffle_only_permutes_whole_chunks():
    """Rows inside a chunk keep their order; row-level mixing is the block shuffle's job."""
    chunk_rows = PLANS["many"]
    for epoch in EPOCHS:
        lay = layout(chunk_rows, 1, 1, epoch, True, 1, False, "uneven")
        rows = rank_rows(lay[0])
        for c, n in enumerate(chunk_rows):
            assert [r for chunk, r in rows if chunk == c] == list(range(n))


@given(
    chunk_rows=st.lists(st.integers(0, 12), max_size=10).map(tuple),
    world_size=st.integers(1, 6),
    num_workers=st.integers(1, 6),
    batch_size=st.integers(1, 8),
    epoch=st.integers(0, 1000),
    seed=st.integers(0, 2**32 - 1),
    shuffle=st.booleans(),
    drop_last=st.booleans(),
    remainder=st.sampled_from(REMAINDER_POLICIES),
)
@settings(max_examples=150, deadline=None)
def test_assignment_properties(
    chunk_rows, world_size, num_workers, batch_size, epoch, seed, shuffle, drop_last, remainder
):
    cfg = {
        "world_size": world_size,
        "num_workers": num_workers,
        "batch_size": batch_size,
        "epoch": epoch,
        "shuffle": shuffle,
        "drop_last": drop_last,
        "remainder": remainder,
    }
    lay = layout(chunk_rows, **cfg, seed=seed)
    for streams in lay:
        for pieces in streams:
            check_pieces_well_formed(chunk_rows, pieces, cfg)
    check_batch_alignment(lay, batch_size, cfg)
    if remainder != "pad":
        everything = [row for streams in lay for row in rank_rows(streams)]
        assert len(everything) == len(set(everything))
    if remainder != "uneven":
        check_equal_batches(lay, batch_size, drop_last, cfg)
    if remainder == "uneven" and not drop_last:
        everything = sorted(row for streams in lay for row in rank_rows(streams))
        assert everything == sorted((c, r) for c, n in enumerate(chunk_rows) for r in range(n))
    one_worker = layout(chunk_rows, **{**cfg, "num_workers": 1}, seed=seed)
    assert [rank_rows(s) for s in lay] == [rank_rows(s) for s in one_worker]


def test_assign_stream_rejects_an_unknown_remainder():
    with pytest.raises(InvalidArgumentError, match="remainder"):
        assign_stream(
            [3, 4],
            Topology(0, 2, 0, 1),
            epoch=0,
            seed=0,
            shuffle=False,
            batch_size=2,
            remainder="wrap",  # type: ignore[arg-type]
        )


# --- rank_span --------------------------------------------------------------------------------


def spans(total: int, world_size: int, batch_size: int, drop_last: bool, remainder: str):
    return [
        rank_span(
            total,
            rank=rank,
            world_size=world_size,
            batch_size=batch_size,
            drop_last=drop_last,
            remainder=remainder,  # type: ignore[arg-type]
        )
        for rank in range(world_size)
    ]


@remainders
def test_rank_spans_tile_the_sequence(remainder):
    for total, world_size in itertools.product(range(31), range(1, 6)):
        got = spans(total, world_size, 1, False, remainder)
        starts = [s for s, _ in got]
        stops = [e for _, e in got]
        lengths = [e - s for s, e in got]
        assert starts[0] == 0
        assert starts[1:] == stops[:-1], (total, world_size, got)  # contiguous, in rank order
        if remainder == "uneven":
            assert stops[-1] == total
            assert max(lengths) - min(lengths) <= 1
        elif remainder == "drop":
            assert len(set(lengths)) == 1
            assert stops[-1] == total - total % world_size
        else:  # pad: equal shares covering everything, padded by less than a row per rank
            assert len(set(lengths)) == 1
            assert total <= stops[-1] < total + world_size, (total, world_size, got)


@remainders
def test_drop_last_trims_each_rank_span_to_whole_batches(remainder):
    for total, world_size, batch_size in itertools.product(range(31), range(1, 6), range(1, 6)):
        full = spans(total, world_size, batch_size, False, remainder)
        trimmed = spans(total, world_size, batch_size, True, remainder)
        for (fs, fe), (ts, te) in zip(full, trimmed, strict=True):
            assert ts == fs
            assert (te - ts) % batch_size == 0
            assert 0 <= fe - te < batch_size


@pytest.mark.parametrize("remainder", ["", "Drop", "round_robin", None])
def test_rank_span_rejects_an_unknown_remainder(remainder):
    with pytest.raises(InvalidArgumentError) as info:
        rank_span(10, rank=0, world_size=2, batch_size=1, drop_last=False, remainder=remainder)  # type: ignore[arg-type]
    assert isinstance(info.value, ValueError)
    assert repr(remainder) in str(info.value)


# --- worker_span ------------------------------------------------------------------------------


def test_worker_spans_are_contiguous_balanced_and_batch_aligned():
    for start, length, num_workers, batch_size in itertools.product(
        (0, 5, 17), range(26), range(1, 6), range(1, 6)
    ):
        span = (start, start + length)
        got = [
            worker_span(span, worker=w, num_workers=num_workers, batch_size=batch_size)
            for w in range(num_workers)
        ]
        ctx = (span, num_workers, batch_size, got)
        assert got[0][0] == start, ctx
        assert got[-1][1] == start + length, ctx
        assert all(a[1] == b[0] for a, b in itertools.pairwise(got)), ctx
        assert all(s <= e for s, e in got), ctx
        # Non-empty streams start on a batch boundary of the rank (empty ones sit at the end).
        assert all((s - start) % batch_size == 0 for s, e in got if e > s), ctx
        lengths = [e - s for s, e in got]
        nonempty = [n for n in lengths if n]
        assert all(n % batch_size == 0 for n in nonempty[:-1]), ctx
        batches = [ceil_div(n, batch_size) for n in lengths]
        assert max(batches) - min(batches) <= 1, ctx
        assert sum(batches) == ceil_div(length, batch_size), ctx


# --- span_pieces ------------------------------------------------------------------------------


def test_span_pieces_wraps_to_the_start_for_padding():
    # Concatenation order: plan chunk 1 (3 rows), then plan chunk 0 (2 rows); 5 rows in all.
    assert span_pieces([3, 2], [1, 0], 4, 7) == [Piece(0, 1, 2), Piece(1, 0, 2)]
    assert span_pieces([3, 2], [1, 0], 5, 8) == [Piece(1, 0, 3)]
    assert span_pieces([3, 2], [1, 0], 0, 5) == [Piece(1, 0, 3), Piece(0, 0, 2)]


@plans
def test_span_pieces_maps_every_span_to_its_rows(chunk_rows):
    order = list(reversed(range(len(chunk_rows))))  # a non-trivial concatenation order
    rows_in_order = [chunk_rows[c] for c in order]
    seq = [(c, r) for c in order for r in range(chunk_rows[c])]
    total = len(seq)
    for start, stop in itertools.product(range(2 * total + 2), repeat=2):
        pieces = span_pieces(rows_in_order, order, start, stop)
        if stop <= start or total == 0:
            assert pieces == [], (start, stop)
            continue
        assert rows_of(pieces) == [seq[p % total] for p in range(start, stop)], (start, stop)
        assert all(p.num_rows > 0 for p in pieces)


def test_span_pieces_accepts_numpy_inputs():
    order = np.array([2, 0, 1])
    rows_in_order = np.array([4, 0, 3])
    pieces = span_pieces(rows_in_order, order, 2, 6)
    assert pieces == [Piece(2, 2, 4), Piece(1, 0, 2)]
    assert all(type(v) is int for p in pieces for v in (p.chunk, p.start, p.stop))


# --- chunk_order ------------------------------------------------------------------------------


def test_chunk_order_is_a_deterministic_permutation():
    for n, seed, epoch in itertools.product(range(13), (0, 7, 2**31), range(3)):
        order = chunk_order(n, seed=seed, epoch=epoch, shuffle=True)
        assert sorted(order.tolist()) == list(range(n))
        again = chunk_order(n, seed=seed, epoch=epoch, shuffle=True)
        assert order.tolist() == again.tolist()


def test_chunk_order_without_shuffle_is_plan_order():
    for n, seed, epoch in itertools.product(range(13), (0, 7), range(3)):
        assert chunk_order(n, seed=seed, epoch=epoch, shuffle=False).tolist() == list(range(n))


def test_chunk_order_differs_by_seed_and_epoch():
    orders = {
        tuple(chunk_order(10, seed=seed, epoch=epoch, shuffle=True).tolist())
        for seed, epoch in itertools.product(range(5), range(5))
    }
    assert len(orders) == 25


def test_piece_num_rows():
    assert Piece(3, 2, 9).num_rows == 7


@pytest.mark.parametrize("shuffle", [False, True])
def test_round_robin_deals_whole_chunks_once(shuffle):
    chunk_rows = [5, 0, 3, 7, 1, 4, 2]
    for world_size, workers, epoch in itertools.product(range(1, 4), range(1, 4), range(3)):
        seen = []
        for rank, worker in itertools.product(range(world_size), range(workers)):
            topology = Topology(rank, world_size, worker, workers)
            pieces = assign_stream(
                chunk_rows,
                topology,
                epoch=epoch,
                seed=7,
                shuffle=shuffle,
                batch_size=2,
                strategy="round_robin",
            )
            assert all(p.start == 0 and p.stop == chunk_rows[p.chunk] for p in pieces)
            seen.extend(p.chunk for p in pieces)
        assert sorted(seen) == [i for i, n in enumerate(chunk_rows) if n]


def test_unknown_split_strategy_is_invalid():
    with pytest.raises(InvalidArgumentError, match="split_strategy"):
        assign_stream([3], Topology(), epoch=0, seed=0, shuffle=False, batch_size=1, strategy="x")
