"""The stream resolver: what each worker reads in a pass and where it starts, for both strategies.

`planning.assign_stream` (brute-forced in tests/unit/planning/test_assign.py) runs the same
`Strategy.runs`; these tests cover what the resolver adds: the batch counts the main process
orders the workers' batches by, and where each stream of a resumed pass starts.
"""

from __future__ import annotations

from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from torch_dataloader_utils.errors import InvalidArgumentError
from torch_dataloader_utils.planning import (
    Iteration,
    Layout,
    Topology,
    round_robin,
    strategy_of,
)
from torch_dataloader_utils.planning.streams import OneSource


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
            Iteration(epoch), Topology(rank, world_size, 0, num_workers)
        )
        assert done == [0] * num_workers
        for worker in range(num_workers):
            topology = Topology(rank, world_size, worker, num_workers)
            stream = OneSource(chunk_rows, layout).resolve(Iteration(epoch), topology)
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
    counts, _ = streams.rank_streams(Iteration(2), rank)
    delivered = min(delivered, sum(counts))
    order = list(round_robin(counts, [0, 0, 0]))[:delivered]  # the workers of the first batches
    counts_again, done = streams.rank_streams(Iteration(2, batches=delivered), rank)
    assert counts_again == counts
    assert done == [order.count(w) for w in range(3)]
    for worker in range(3):
        resumed = Iteration(2, batches=delivered)
        stream = streams.resolve(resumed, Topology(0, 1, worker, 3))
        assert stream.done == done[worker]
        assert stream.start == min(done[worker] * 4, stream.length)
        fresh = streams.resolve(Iteration(2), Topology(0, 1, worker, 3))
        assert stream.sources[0].pieces() == fresh.sources[0].pieces()  # same rows


def test_a_worker_state_overrides_the_rank_position() -> None:
    layout = layout_of("equal", batch_size=4, drop_last=False, shuffle=False)
    stream = OneSource([40], layout).resolve(Iteration(0, batches=6), Topology(0, 1, 1, 2), done=1)
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
