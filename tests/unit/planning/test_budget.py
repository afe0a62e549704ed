"""Token-budget batches' pure steps by brute force: a group cut under its budget, batches
split to a count, every group's count from the length index."""

from __future__ import annotations

import itertools

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from torch_dataloader_utils.planning.budget import equalised, group_batches, group_counts

lengths_st = st.lists(st.integers(0, 50), max_size=40)


@settings(max_examples=400, deadline=None)
@given(lengths=lengths_st, budget=st.integers(1, 200))
def test_a_group_is_cut_greedily_within_its_budget(lengths: list[int], budget: int) -> None:
    values = np.asarray(lengths, dtype=np.int64)
    order, bounds = group_batches(values, budget)
    assert sorted(order.tolist()) == list(range(len(lengths)))  # every row once
    assert bounds[0] == 0 and bounds[-1] == len(lengths)
    for a, b in itertools.pairwise(bounds):
        rows = values[order[a:b]]
        longest = max(int(rows.max()), 1)
        assert b - a == 1 or (b - a) * longest <= budget  # (a row over it: alone)
        if b < len(lengths):  # greedy: one more row would not fit
            more = max(longest, int(values[order[b]]), 1)
            assert (b - a + 1) * more > budget
        assert list(rows) == sorted(rows)  # shortest first


@settings(max_examples=400, deadline=None)
@given(lengths=lengths_st, budget=st.integers(1, 200), extra=st.integers(0, 50))
def test_splitting_reaches_the_count_and_keeps_every_batch_within_budget(
    lengths: list[int], budget: int, extra: int
) -> None:
    values = np.asarray(lengths, dtype=np.int64)
    order, bounds = group_batches(values, budget)
    count = len(bounds) - 1 + extra
    split = equalised(bounds, count)
    assert len(split) - 1 == min(count, len(lengths)) or not lengths
    assert set(bounds) <= set(split) and split == sorted(set(split))
    for a, b in itertools.pairwise(split):
        rows = values[order[a:b]]
        assert b - a >= 1
        assert b - a == 1 or (b - a) * max(int(rows.max()), 1) <= budget


@settings(max_examples=100, deadline=None)
@given(lengths=lengths_st, group=st.integers(1, 12), budget=st.integers(1, 200))
def test_group_counts_are_each_groups_batches(lengths: list[int], group: int, budget: int) -> None:
    values = np.asarray(lengths, dtype=np.int64)
    counts = group_counts(values, group, budget)
    expected = [
        len(group_batches(values[a : a + group], budget)[1]) - 1
        for a in range(0, len(lengths), group)
    ]
    assert counts.tolist() == expected
