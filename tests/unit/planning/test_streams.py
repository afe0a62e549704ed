"""The stream resolver: what each worker reads in a pass and where it starts, for both strategies.

`planning.assign_stream` (brute-forced in tests/unit/planning/test_assign.py) runs the same
`Strategy.runs`; these tests cover what the resolver adds: the batch counts the main process
orders the workers' batches by, and where each stream of a resumed pass starts.
"""

from __future__ import annotations

import dataclasses
from collections import Counter

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from torch_dataloader_utils.errors import InvalidArgumentError
from torch_dataloader_utils.planning import (
    Layout,
    Leg,
    Pass,
    Topology,
    delivery_order,
    strategy_of,
)
from torch_dataloader_utils.planning.budget import Lengths
from torch_dataloader_utils.planning.mixture import Mixture
from torch_dataloader_utils.planning.schedule import Schedule
from torch_dataloader_utils.planning.streams import Budgeted, Mixed, OneSource, Streams


def layout_of(strategy: str, *, batch_size: int, drop_last: bool, shuffle: bool) -> Layout:
    return Layout(
        batch_size=batch_size,
        shuffle=shuffle,
        seed=7,
        drop_last=drop_last,
        remainder="uneven" if strategy == "round_robin" else "drop",
        block_rows=2 * batch_size,
        first_block_rows=batch_size,
        strategy=strategy,  # type: ignore[arg-type]
    )


@settings(max_examples=150, deadline=None)
@given(
    chunk_rows=st.lists(st.integers(0, 40), min_size=0, max_size=12),
    strategy=st.sampled_from(["equal", "round_robin"]),
    world_size=st.integers(1, 3),
    num_workers=st.integers(1, 4),
    batch_size=st.integers(1, 9),
    drop_last=st.booleans(),
    shuffle=st.booleans(),
    epoch=st.integers(0, 3),
)
def test_every_row_once_and_counts_agree_with_what_each_worker_reads(
    chunk_rows: list[int],
    strategy: str,
    world_size: int,
    num_workers: int,
    batch_size: int,
    drop_last: bool,
    shuffle: bool,
    epoch: int,
) -> None:
    layout = layout_of(strategy, batch_size=batch_size, drop_last=drop_last, shuffle=shuffle)
    seen: Counter[tuple[int, int]] = Counter()
    for rank in range(world_size):
        counts, done = OneSource(chunk_rows, layout).rank_streams(
            Pass(epoch), Topology(rank, world_size, 0, num_workers)
        )
        assert done == [0] * num_workers
        for worker in range(num_workers):
            topology = Topology(rank, world_size, worker, num_workers)
            stream = OneSource(chunk_rows, layout).resolve(Pass(epoch), topology)
            assert stream.batches == counts[worker]
            assert stream.done == 0 and stream.start == 0
            (rows,) = stream.sources
            pieces = rows.pieces()
            assert sum(p.num_rows for p in pieces) == stream.length
            assert layout.batches(stream.length) == stream.batches
            seen.update((p.chunk, row) for p in pieces for row in range(p.start, p.stop))
    assert max(seen.values(), default=1) == 1  # no row twice
    if strategy == "round_robin" or world_size == 1:
        # Whole chunks dealt to streams, or one rank: nothing is left to a remainder policy.
        dropped = sum(chunk_rows) - sum(seen.values())
        assert dropped == 0 or (drop_last and strategy == "equal" and dropped < batch_size)


@pytest.mark.parametrize("strategy", ["equal", "round_robin"])
@pytest.mark.parametrize("delivered", [0, 1, 2, 5, 9, 10])
def test_a_resumed_pass_starts_each_stream_after_the_batches_dataloader_order_gave(
    strategy: str, delivered: int
) -> None:
    chunk_rows = [13, 0, 7, 21, 4, 9]
    layout = layout_of(strategy, batch_size=4, drop_last=False, shuffle=True)
    rank = Topology(0, 1, 0, 3)
    streams = OneSource(chunk_rows, layout)
    counts, _ = streams.rank_streams(Pass(2), rank)
    delivered = min(delivered, sum(counts))
    order = list(delivery_order(counts, [0, 0, 0]))[:delivered]  # the workers of the first batches
    counts_again, done = streams.rank_streams(Pass(2, batches=delivered), rank)
    assert counts_again == counts
    assert done == [order.count(w) for w in range(3)]
    for worker in range(3):
        resumed = Pass(2, batches=delivered)
        stream = streams.resolve(resumed, Topology(0, 1, worker, 3))
        assert stream.done == done[worker]
        assert stream.start == min(done[worker] * 4, stream.length)
        fresh = streams.resolve(Pass(2), Topology(0, 1, worker, 3))
        assert stream.sources[0].pieces() == fresh.sources[0].pieces()  # same rows


def test_a_worker_state_overrides_the_rank_position() -> None:
    layout = layout_of("equal", batch_size=4, drop_last=False, shuffle=False)
    stream = OneSource([40], layout).resolve(Pass(0, batches=6), Topology(0, 1, 1, 2), done=1)
    assert stream.done == 1 and stream.start == 4


def test_an_unknown_strategy_names_the_known_ones() -> None:
    with pytest.raises(InvalidArgumentError, match="'equal', 'round_robin'"):
        strategy_of("weighted")


def test_strategies_say_what_they_promise() -> None:
    equal, dealt = strategy_of("equal"), strategy_of("round_robin")
    assert equal.batch_aligned
    assert not dealt.batch_aligned
    layout = layout_of("round_robin", batch_size=4, drop_last=False, shuffle=False)
    with pytest.raises(TypeError, match="depends on the workers"):
        dealt.rank_batches(100, Topology(), layout)


# --- what callers ask of a kind, behind the protocol -------------------------------------------


def kinds() -> list[Streams]:
    """A dataset's streams of every kind: one source, a mixture (with a schedule and without)
    and one source in token-budget batches."""
    layout = layout_of("equal", batch_size=4, drop_last=False, shuffle=True)
    chunks = (np.asarray([30, 12]), np.asarray([20]))
    schedule = Schedule((0, 5), ((1.0, 1.0), (1.0, 3.0)))
    lengths = Lengths(40, np.arange(42, dtype=np.int32) % 9 + 1, np.asarray([30, 12]))
    return [
        OneSource([30, 12], layout),
        Mixed(Mixture(chunks, (30, 20), "stratified"), layout),
        Mixed(Mixture(chunks, (30, 20), "stratified", schedule), layout),
        OneSource([30, 12], layout).budgeted(lengths, "tokens", truncate=True),
    ]


def test_each_kind_says_what_callers_ask_of_it() -> None:
    one, mixed, _, budget = kinds()
    assert [s.scheduled for s in kinds()] == [False, False, True, False]
    assert [s.lengths is None for s in kinds()] == [True, True, True, False]
    assert [s.skips_carried for s in kinds()] == [True, True, True, False]
    packed = dataclasses.replace(one.layout, seq_tokens=2)
    assert not one.with_layout(packed).skips_carried
    assert not mixed.with_layout(packed).skips_carried
    assert isinstance(budget, Budgeted)
    assert (budget.column, budget.truncate, budget.lengths.max_tokens) == ("tokens", True, 40)


def test_with_layout_is_the_same_streams_under_another_layout() -> None:
    for streams in kinds():
        assert streams.with_layout(streams.layout) is streams
        other = dataclasses.replace(streams.layout, batch_size=3, seed=8)
        moved = streams.with_layout(other)
        assert type(moved) is type(streams) and moved.layout == other
        assert (moved.scheduled, moved.lengths) == (streams.scheduled, streams.lengths)
        counts, _ = moved.rank_streams(Pass(1), Topology(0, 1, 0, 2))
        assert sum(counts) == moved.rank_batches(Topology(0, 1, 0, 2), 1)


def test_only_one_sources_streams_are_budgeted() -> None:
    _, mixed, _, budget = kinds()
    lengths = budget.lengths
    assert lengths is not None
    for streams in (mixed, budget):
        with pytest.raises(InvalidArgumentError, match=r"token-budget|token budgets"):
            streams.budgeted(lengths, "tokens", truncate=False)


def test_a_streams_block_order_is_keyed_by_its_pass_topology_and_source() -> None:
    _, mixed, _, _ = kinds()
    leg = Leg(1, 2, mixed.layout, 1)
    stream = mixed.resolve(Pass(3, legs=(leg,)), Topology(1, 2, 1, 2))
    for rows in stream.sources:
        order = stream.order_of(rows)
        assert (order.epoch, order.stream, order.leg, order.source) == (3, 3, 1, rows.index)
        assert (order.layout, order.length) == (rows.order.layout, rows.length)
