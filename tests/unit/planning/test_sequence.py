"""An epoch's sequence as runs of positions, and how streams are cut from it, by brute force.

Every list of items is expanded to the explicit list of positions it stands for (a ``Run`` its
range or its selection, a ``Deferred`` whatever its runs expand to); ``cut`` and the stream cuts
are checked against slicing that list, positions past the end wrapping to the start.
"""

from __future__ import annotations

import itertools
from collections import Counter
from collections.abc import Callable, Sequence

import numpy as np
import pytest

from torch_dataloader_utils.planning import (
    REMAINDER_POLICIES,
    Deferred,
    Layout,
    Piece,
    Run,
    Topology,
    cut,
    round_robin_runs,
    run_pieces,
    sequence_length,
    stream_runs,
    stream_spans,
)


def sel(*positions: int) -> Run:
    """A run of these (sorted) positions only."""
    select = np.array(positions, dtype=np.int64)
    return Run(int(select[0]), int(select[-1]) + 1, select)


def expand(items: Sequence[Run | Deferred]) -> list[int]:
    """The positions ``items`` stand for, in order (independent of ``cut``)."""
    out: list[int] = []
    for item in items:
        if isinstance(item, Deferred):
            runs = item.make()
            assert sum(r.num_rows for r in runs) == item.num_rows
            out.extend(expand(runs))
        elif item.select is None:
            out.extend(range(item.start, item.stop))
        else:
            out.extend(int(p) for p in item.select)
    return out


def check_runs_well_formed(runs: Sequence[Run], ctx: object) -> None:
    for run in runs:
        assert isinstance(run, Run), ctx
        assert run.num_rows > 0, ctx  # cut never returns empty runs
        assert run.start < run.stop, ctx
        if run.select is not None:
            s = run.select.tolist()
            assert s == sorted(set(s)), ctx
            assert run.start <= s[0] and s[-1] < run.stop, ctx


class Counting:
    """A ``make`` that counts its calls."""

    def __init__(self, runs: list[Run]):
        self.runs = runs
        self.calls = 0

    def __call__(self) -> list[Run]:
        self.calls += 1
        return list(self.runs)


def deferred(*runs: Run) -> Deferred:
    return Deferred(sum(r.num_rows for r in runs), Counting(list(runs)))


# Each factory builds fresh items (fresh call counters).
ITEMS: dict[str, Callable[[], list[Run | Deferred]]] = {
    "empty": lambda: [],
    "zero-run": lambda: [Run(0, 0)],
    "one": lambda: [Run(0, 1)],
    "range": lambda: [Run(0, 9)],
    "offset": lambda: [Run(5, 12)],
    "two-runs": lambda: [Run(10, 14), Run(0, 3)],
    "zero-between": lambda: [Run(0, 3), Run(3, 3), Run(7, 9)],
    "select": lambda: [sel(2, 5, 6, 11)],
    "mixed": lambda: [Run(20, 23), sel(1, 4, 9), Run(30, 31), sel(40, 41)],
    "deferred": lambda: [deferred(Run(0, 4), sel(7, 8, 12))],
    "deferred-mix": lambda: [
        Run(100, 103),
        deferred(sel(3, 6), Run(10, 12)),
        deferred(),
        sel(50, 52, 53),
        deferred(Run(60, 61)),
        Run(70, 74),
    ],
    "deferred-only": lambda: [deferred(Run(0, 2)), deferred(sel(4, 9, 10)), deferred(Run(5, 6))],
}
items_cases = pytest.mark.parametrize("name", list(ITEMS))


# --- Run ----------------------------------------------------------------------------------------


def test_run_without_select():
    run = Run(3, 9)
    assert run.num_rows == 6
    assert run.positions(np.array([0, 2, 5])).tolist() == [3, 5, 8]
    sub = run.sub(1, 4)
    assert (sub.start, sub.stop, sub.select) == (4, 7, None)
    assert run.sub(2, 2).num_rows == 0
    earlier = run.part(1, 4)  # the earlier name of sub
    assert (earlier.start, earlier.stop, earlier.select) == (4, 7, None)


def test_run_with_select():
    run = sel(2, 5, 6, 11)
    assert run.num_rows == 4
    assert run.positions(np.array([0, 3])).tolist() == [2, 11]
    sub = run.sub(1, 3)
    assert (sub.start, sub.stop, sub.select.tolist()) == (5, 7, [5, 6])
    assert run.sub(4, 4).num_rows == 0
    for first, last in itertools.product(range(5), repeat=2):
        if first < last:
            assert expand([run.sub(first, last)]) == [2, 5, 6, 11][first:last]


@items_cases
def test_sequence_length_counts_rows_without_making_deferred_items(name):
    items = ITEMS[name]()
    assert sequence_length(items) == len(expand(ITEMS[name]()))
    assert all(item.make.calls == 0 for item in items if isinstance(item, Deferred))


# --- cut ----------------------------------------------------------------------------------------


@items_cases
def test_cut_is_slicing_with_wrap(name):
    seq = expand(ITEMS[name]())
    total = len(seq)
    for start, stop in itertools.product(range(2 * total + 3), repeat=2):
        got = cut(ITEMS[name](), start, stop)
        ctx = (name, start, stop)
        if stop <= start or total == 0:
            assert got == [], ctx
            continue
        check_runs_well_formed(got, ctx)
        assert expand(got) == [seq[p % total] for p in range(start, stop)], ctx


def test_cut_wraps_more_than_once():
    items = [Run(0, 2), sel(5, 7)]
    assert expand(cut(items, 3, 12)) == [7, 0, 1, 5, 7, 0, 1, 5, 7]


@items_cases
def test_cut_makes_deferred_items_only_when_the_range_touches_them(name):
    total = len(expand(ITEMS[name]()))
    for start, stop in itertools.product(range(2 * total + 2), repeat=2):
        items = ITEMS[name]()
        cut(items, start, stop)
        lo = 0
        for item in items:
            hi = lo + item.num_rows
            if isinstance(item, Deferred):
                touched = total and any(lo <= p % total < hi for p in range(start, stop))
                ctx = (name, start, stop, lo, hi, item.make.calls)
                if not touched:
                    assert item.make.calls == 0, ctx
                elif stop <= total:
                    assert item.make.calls == 1, ctx  # no wrap: each item is visited once
                else:
                    assert item.make.calls >= 1, ctx
            lo = hi


# --- stream_runs ----------------------------------------------------------------------------


def spans_of(total, world_size, num_workers, batch_size, drop_last, remainder):
    layout = Layout(batch_size, False, 0, drop_last, remainder, 1, 1)
    return [
        stream_spans(total, rank=r, world_size=world_size, num_workers=num_workers, layout=layout)
        for r in range(world_size)
    ]


@items_cases
@pytest.mark.parametrize("remainder", REMAINDER_POLICIES)
def test_stream_runs_are_the_stream_spans_of_the_sequence(name, remainder):
    seq = expand(ITEMS[name]())
    total = len(seq)
    for world_size, num_workers, batch_size, drop_last in itertools.product(
        range(1, 4), range(1, 4), range(1, 4), (False, True)
    ):
        spans = spans_of(total, world_size, num_workers, batch_size, drop_last, remainder)
        everything: list[int] = []
        rank_rows = []
        for rank, worker in itertools.product(range(world_size), range(num_workers)):
            runs = stream_runs(
                ITEMS[name](),
                Topology(rank, world_size, worker, num_workers),
                batch_size=batch_size,
                drop_last=drop_last,
                remainder=remainder,
            )
            ctx = (name, world_size, num_workers, batch_size, drop_last, rank, worker)
            check_runs_well_formed(runs, ctx)
            a, b = spans[rank][worker]
            got = expand(runs)
            assert got == [seq[p % total] for p in range(a, b)], ctx
            everything.extend(got)
            if worker == 0:
                rank_rows.append(0)
            rank_rows[-1] += len(got)
        # What all streams read together, by the policy's definition.
        counts, full = Counter(everything), Counter(seq)
        if remainder == "uneven" and not drop_last:
            assert counts == full
        elif remainder != "pad":
            assert not counts - full  # every row at most once
            assert total - len(everything) < world_size * batch_size + world_size
        else:
            assert not full - counts or drop_last  # padding covers every row ...
            assert len(everything) - total < world_size  # ... with fewer repeats than ranks
        if remainder != "uneven":
            assert len(set(rank_rows)) <= 1


# --- round_robin_runs -----------------------------------------------------------------------


@pytest.mark.parametrize(
    "rows_in_order", [(), (0,), (4,), (3, 0, 5), (1, 1, 1, 1, 1), (2, 9, 0, 4, 1, 6, 3)]
)
def test_round_robin_runs_deal_whole_chunks_in_turn(rows_in_order):
    starts = np.concatenate([[0], np.cumsum(rows_in_order)]).astype(int).tolist()
    total = sum(rows_in_order)
    for world_size, num_workers in itertools.product(range(1, 4), range(1, 4)):
        everything: list[int] = []
        for rank, worker in itertools.product(range(world_size), range(num_workers)):
            topology = Topology(rank, world_size, worker, num_workers)
            runs = round_robin_runs(list(rows_in_order), topology)
            check_runs_well_formed(runs, topology)
            chunks = [i for i, n in enumerate(rows_in_order) if n]
            mine = [i for i in chunks if i % topology.num_streams == topology.stream]
            assert [(r.start, r.stop) for r in runs] == [(starts[i], starts[i + 1]) for i in mine]
            everything.extend(expand(runs))
        assert sorted(everything) == list(range(total))


# --- run_pieces -----------------------------------------------------------------------------


def test_run_pieces_map_runs_to_chunk_rows():
    rows_in_order = [3, 0, 5, 2]
    order = [2, 0, 3, 1]  # plan index of each chunk in concatenation order
    seq = [(order[i], r) for i, n in enumerate(rows_in_order) for r in range(n)]
    total = len(seq)

    def rows(pieces: list[Piece]) -> list[tuple[int, int]]:
        return [(p.chunk, r) for p in pieces for r in range(p.start, p.stop)]

    for start, stop in itertools.product(range(total + 1), repeat=2):
        if start >= stop:
            continue
        pieces, take = run_pieces(Run(start, stop), rows_in_order, order)
        assert take is None
        assert rows(pieces) == seq[start:stop]
    for size in range(1, 5):
        for chosen in itertools.combinations(range(total), size):
            pieces, take = run_pieces(sel(*chosen), rows_in_order, np.array(order))
            assert take is not None
            assert [rows(pieces)[i] for i in take.tolist()] == [seq[p] for p in chosen]
    # A run past the end (padding) wraps like the sequence.
    pieces, take = run_pieces(Run(total - 1, total + 2), rows_in_order, order)
    assert take is None
    assert rows(pieces) == [seq[-1], seq[0], seq[1]]
