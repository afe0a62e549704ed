"""Packs balanced by compute across ranks (issue 45): the cost models, and the window's
assignment: every batch once, optimal, deterministic, no curriculum, partial windows."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from torch_dataloader_utils.errors import InvalidArgumentError
from torch_dataloader_utils.planning.balance import (
    balance_epoch,
    balance_window,
    batch_costs,
    linear_coefficient,
    reorder_window,
    step_costs,
    straggler_overhead,
    window_permutation,
)


def spearman(x: np.ndarray, y: np.ndarray) -> float:
    """Spearman's rank correlation (ties get their average rank)."""
    return float(np.corrcoef(_ranks(x), _ranks(y))[0, 1])


def _ranks(x: np.ndarray) -> np.ndarray:
    _, inverse, counts = np.unique(x, return_inverse=True, return_counts=True)
    start = np.cumsum(counts) - counts
    ranks: np.ndarray = (start + (counts - 1) / 2)[inverse]
    return ranks


def sum_of_max(costs: np.ndarray, assignment: np.ndarray) -> float:
    return float(step_costs(costs, assignment).max(axis=1).sum())


def brute_force_best(costs: np.ndarray) -> float:
    """The least sum over steps of the slowest rank over every way to give the batches out."""
    steps, ranks = costs.shape
    flat = costs.ravel()
    return min(
        float(flat[list(p)].reshape(steps, ranks).max(axis=1).sum())
        for p in itertools.permutations(range(flat.size))
    )


def brute_force_own(costs: np.ndarray) -> float:
    """The same, each rank reordering only its own batches."""
    ranks = costs.shape[1]
    columns = [list(itertools.permutations(costs[:, r])) for r in range(ranks)]
    return min(float(np.array(cols).T.max(axis=1).sum()) for cols in itertools.product(*columns))


def assert_each_once(assignment: np.ndarray, n: int) -> None:
    assert sorted(assignment.ravel().tolist()) == list(range(n))


def test_costs_by_hand():
    lengths = np.array([3, 1, 4, 2, 2])
    offsets = np.array([0, 3, 3, 5])  # batches: [3, 1, 4], [], [2, 2]
    assert batch_costs(lengths, offsets).tolist() == [8, 0, 4]
    assert batch_costs(lengths, offsets, "tokens").tolist() == [8, 0, 4]
    assert batch_costs(lengths, offsets, "attention").tolist() == [26, 0, 8]
    assert batch_costs(lengths, offsets, "attention", linear=10).tolist() == [106, 0, 48]
    # Offsets need not start at 0: batches of a slice.
    assert batch_costs(lengths, np.array([3, 5]), "attention", linear=1).tolist() == [12]
    assert batch_costs(lengths, np.array([0]), "attention").tolist() == []


def test_a_callable_cost_gets_each_batch_s_lengths():
    seen: list[list[int]] = []

    def longest(lengths: np.ndarray) -> float:
        assert lengths.dtype == np.int64
        seen.append(lengths.tolist())
        return float(lengths.max()) if len(lengths) else 0.0

    lengths = np.array([3, 1, 4, 2, 2], dtype=np.int32)
    assert batch_costs(lengths, np.array([0, 3, 3, 5]), longest).tolist() == [4, 0, 2]
    assert seen == [[3, 1, 4], [], [2, 2]]


def test_vectorised_costs_match_a_loop():
    rng = np.random.default_rng(3)
    lengths = rng.integers(1, 5000, size=2000)
    offsets = np.concatenate(([0], np.sort(rng.integers(0, 2000, size=99)), [2000]))
    got = batch_costs(lengths, offsets, "attention", linear=123.5)
    for b in range(len(offsets) - 1):
        frag = lengths[offsets[b] : offsets[b + 1]].astype(np.float64)
        assert got[b] == pytest.approx(float((frag**2).sum() + 123.5 * frag.sum()), rel=1e-12)


@pytest.mark.parametrize(
    ("lengths", "offsets", "cost"),
    [
        ([1, 2], [0, 3], "tokens"),  # past the end
        ([1, 2], [0, 2, 1], "tokens"),  # decreasing
        ([1, 2], [-1, 2], "tokens"),
        ([1, -2], [0, 2], "tokens"),
        ([1, 2], [], "tokens"),
        ([1, 2], [0, 2], "flops"),
    ],
)
def test_bad_cost_inputs_are_refused(lengths, offsets, cost):
    with pytest.raises(InvalidArgumentError):
        batch_costs(np.array(lengths), np.array(offsets), cost)


def test_linear_coefficient_from_a_model_shape():
    h = 4096
    assert linear_coefficient(h) == 24 * h * h / (2 * h)  # 12 h, causal
    assert linear_coefficient(h, causal=False) == 6 * h
    # From the layers' parameters: 2 N / layers a token against 2 h an L**2.
    assert linear_coefficient(h, params=6.7e9, layers=32) == pytest.approx(6.7e9 / (32 * h))
    # A dense layer is ~12 h**2 parameters: the two forms agree.
    assert linear_coefficient(h, params=12 * h * h * 32, layers=32) == linear_coefficient(h)
    for bad in (
        {"hidden": 0},
        {"hidden": h, "params": 1e9},
        {"hidden": h, "params": 0, "layers": 2},
    ):
        with pytest.raises(InvalidArgumentError):
            linear_coefficient(**bad)


def test_straggler_overhead_by_hand():
    assert straggler_overhead(np.array([[1.0, 3.0], [2.0, 2.0]])) == pytest.approx(0.25)
    assert straggler_overhead(np.ones((4, 8))) == 0.0
    assert straggler_overhead(np.zeros((2, 2))) == 0.0
    for bad in (np.ones(3), np.ones((0, 2))):
        with pytest.raises(InvalidArgumentError):
            straggler_overhead(bad)


@pytest.mark.parametrize("shape", [(1, 1), (1, 5), (7, 1), (5, 3), (64, 8), (3, 64)])
def test_every_batch_exactly_once(shape):
    rng = np.random.default_rng(sum(shape))
    for costs in (rng.random(shape), rng.integers(0, 3, size=shape).astype(float)):  # (ties)
        assert_each_once(balance_window(costs, seed=1), costs.size)
        own = reorder_window(costs, seed=1)
        assert_each_once(own, costs.size)
        assert (own % shape[1] == np.arange(shape[1])).all()  # each rank keeps its own


@pytest.mark.parametrize("shape", [(3, 2), (2, 3), (4, 2), (2, 4), (6, 1), (1, 6)])
def test_optimal_against_brute_force(shape):
    rng = np.random.default_rng(shape[0] * 10 + shape[1])
    for trial in range(3):
        costs = rng.integers(0, 4, size=shape).astype(float) if trial else rng.random(shape)
        best = sum_of_max(costs, balance_window(costs, seed=trial))
        assert best == pytest.approx(brute_force_best(costs))
        if costs.size <= 6 or shape[1] <= 2:
            own = sum_of_max(costs, reorder_window(costs, seed=trial))
            assert own == pytest.approx(brute_force_own(costs))


def test_balancing_beats_reordering_beats_the_plan():
    rng = np.random.default_rng(7)
    costs = rng.lognormal(0, 1, size=(64, 8))
    plan = straggler_overhead(costs)
    own = straggler_overhead(step_costs(costs, reorder_window(costs, seed=0)))
    moved = straggler_overhead(step_costs(costs, balance_window(costs, seed=0)))
    assert moved < own < plan
    assert moved < 0.1 * plan


def test_batches_stay_on_their_rank_where_they_can():
    # Each step's batches already even: nothing needs to move between ranks.
    costs = np.repeat(np.random.default_rng(1).permutation(16).astype(float)[:, None], 4, axis=1)
    assignment = balance_window(costs, seed=3)
    assert (assignment % 4 == np.arange(4)).all()
    # In general as many stay as there are distinct planned ranks in a step's group.
    costs = np.random.default_rng(2).integers(0, 5, size=(32, 8)).astype(float)
    assignment = balance_window(costs, seed=3)
    stays = (assignment % 8 == np.arange(8)).sum(axis=1)
    assert (stays == [len(set((row % 8).tolist())) for row in assignment]).all()


def test_deterministic_in_its_key():
    costs = np.random.default_rng(5).random((64, 8))
    first = balance_window(costs, seed=9, epoch=2, window=4)
    assert (balance_window(costs.copy(), seed=9, epoch=2, window=4) == first).all()
    others = [
        {"seed": 10, "epoch": 2, "window": 4},
        {"seed": 9, "epoch": 3, "window": 4},
        {"seed": 9, "epoch": 2, "window": 5},
        {"seed": 9, "epoch": 2, "window": 4, "leg": 1},
    ]
    for key in others:
        other = balance_window(costs, **key)
        assert not (other == first).all(), key
        # The same steps (groups of batches), in another order.
        assert sorted(map(sorted, other.tolist())) == sorted(map(sorted, first.tolist()))


def test_steps_follow_the_window_permutation():
    costs = np.random.default_rng(6).random((50, 4))
    assignment = balance_window(costs, seed=1, epoch=2, window=3)
    # The k-th cheapest group sits at the step the permutation names.
    dearest = step_costs(costs, assignment).max(axis=1)
    perm = window_permutation(50, seed=1, epoch=2, window=3)
    assert (np.argsort(np.argsort(dearest))[np.argsort(perm)] == np.arange(50)).all()
    assert (np.argsort(perm) != np.arange(50)).any()


def test_no_curriculum_over_an_epoch():
    rng = np.random.default_rng(11)
    steps, ranks = 16384, 8
    costs = rng.lognormal(0, 1, size=(steps, ranks))
    for window in (64, 4096):  # (few large windows: a sorted window would show globally)
        for across in (True, False):
            assignment = balance_epoch(costs, window=window, seed=4, across_ranks=across)
            assert_each_once(assignment, costs.size)
            step = step_costs(costs, assignment).max(axis=1)
            index = np.arange(steps)
            assert abs(spearman(index, step)) < 0.05, (window, across)
            # Nor inside the windows: a sawtooth of cheap-to-dear windows would be one.
            assert abs(spearman(index % window, step)) < 0.05, (window, across)


def test_windows_keep_their_batches_and_the_last_is_partial():
    rng = np.random.default_rng(12)
    steps, ranks, window = 10, 3, 4
    costs = rng.random((steps, ranks))
    for across, arrange in ((True, balance_window), (False, reorder_window)):
        assignment = balance_epoch(costs, window=window, seed=8, epoch=1, across_ranks=across)
        assert_each_once(assignment, costs.size)
        for index, start in enumerate(range(0, steps, window)):
            stop = min(start + window, steps)
            expected = arrange(costs[start:stop], seed=8, epoch=1, window=index) + start * ranks
            assert (assignment[start:stop] == expected).all()  # the windows in plan order
    assert balance_epoch(np.ones((0, 3)), window=4, seed=0).shape == (0, 3)


@pytest.mark.parametrize(
    "bad", [np.ones(4), np.ones((0, 3)), np.ones((2, 0)), np.full((2, 2), np.nan)]
)
def test_bad_windows_are_refused(bad):
    with pytest.raises(InvalidArgumentError):
        balance_window(bad, seed=0)
    with pytest.raises(InvalidArgumentError):
        reorder_window(bad, seed=0)


@pytest.mark.parametrize("window", [0, -1, 2.5, True])
def test_bad_window_sizes_are_refused(window):
    with pytest.raises(InvalidArgumentError):
        balance_epoch(np.ones((4, 2)), window=window, seed=0)
