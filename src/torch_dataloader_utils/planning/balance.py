"""Packs balanced by compute across ranks: what a batch costs, and which batch each rank takes
at each step of a window so that no rank waits for another (pure; issue 45).

A data-parallel step lasts as long as its slowest rank. At long context a packed batch's cost
is not its token count: attention grows with the square of each document piece's length. The
plan already fixes every batch's document fragments (the lengths ``cu_seqlens`` cuts), so
their costs are known before the epoch, and a window of ``W`` steps x ``R`` ranks can hand its
``R * W`` batches out again (`balance_window`): every batch exactly once, each step's ``R``
batches of similar cost, and the steps in a seeded random order so that cheap and dear steps
make no curriculum. Every rank computes the same answer from the same costs: no collective.

Cost models (`batch_costs`), over a batch's fragment lengths ``L_i``:

- ``"tokens"``: ``sum L_i``;
- ``"attention"``: ``sum L_i**2 + linear * sum L_i``, in units of one ``L**2``; ``linear``
  weighs the dense part (projections, MLP) against attention (`linear_coefficient`);
- a callable over one batch's fragment lengths, returning its cost.

The standard FLOP accounting (Kaplan et al. 2020, "Scaling Laws for Neural Language Models",
Table 1: ``C_forward = 2N + 2 n_layer n_ctx d_attn`` a token; Chowdhery et al. 2022, "PaLM",
Appendix B: ``6N + 12 L H Q T`` a token for training): a token costs ``2 N / n_layer`` forward
FLOPs a layer in its dense part (``N ~ 12 n_layer h**2``: ``24 h**2``), and a (query, key)
pair ``4 h`` a layer in attention (``2 h`` for ``QK^T``, ``2 h`` for ``AV``); backward is about
twice forward for both, so the ratio holds for training. A document of ``L`` tokens has
``L**2 / 2`` causal pairs (what FlashAttention-style kernels compute), ``2 h L**2`` a layer.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..errors import InvalidArgumentError

__all__ = [
    "BALANCE",
    "COST_MODELS",
    "BalancedPass",
    "balance_epoch",
    "balance_window",
    "batch_costs",
    "linear_coefficient",
    "reorder_window",
    "step_costs",
    "straggler_overhead",
    "window_permutation",
]


@dataclass(frozen=True, eq=False)
class BalancedPass:
    """What a balanced stream's pass reads (`planning.balanced.Balanced`).

    Attributes:
        sources: the streams of its worker on every rank (``streams.Stream``, rank ``j``'s at
            ``j``), each resolved to start at batch ``first``.
        first: the batch the sources start at: the first of the window the pass starts in.
        picks: shape ``(n, 2)``: the source (rank) and that source's batch of each batch the
            stream delivers, from the pass's first on.
    """

    sources: tuple[Any, ...]
    first: int
    picks: np.ndarray


# The salt of a window's step order (kept apart from `planning.shuffle`'s keys).
BALANCE = 0xBA1
COST_MODELS = ("tokens", "attention")

CostModel = str | Callable[[np.ndarray], float]


def linear_coefficient(
    hidden: int,
    *,
    params: float | None = None,
    layers: int | None = None,
    causal: bool = True,
) -> float:
    """The ``linear`` of the ``"attention"`` cost for a model's shape: a token's dense FLOPs
    over the attention FLOPs of one unit of ``L**2``, both a layer (the module docstring).

    ``linear = dense / (4 h)`` (``/ (2 h)`` when ``causal``: a document of ``L`` tokens has about
    ``L**2 / 2`` query-key pairs), where ``dense`` is ``2 * params / layers`` when both are
    given, else ``24 * hidden**2`` (four ``h x h`` projections and a ``4h`` MLP). For a
    Llama-2-7B-like shape (``hidden=4096, params=6.7e9, layers=32``, causal) it is about 51,000
    (``12.5 h``): a document's attention outweighs its dense part past some 51k tokens.

    Args:
        hidden: the model's width (query heads x head size).
        params: the parameters of the layers (not the embeddings); with ``layers``.
        layers: the number of layers; with ``params``.
        causal: the attention is causal and its kernel skips the masked half.

    Returns:
        The coefficient, in units of ``L**2`` a token.

    Raises:
        InvalidArgumentError: a size is not positive, or only one of ``params``/``layers``.
    """
    if hidden <= 0:
        raise InvalidArgumentError(f"linear_coefficient's hidden must be positive, got {hidden}")
    if (params is None) != (layers is None):
        raise InvalidArgumentError("linear_coefficient takes params and layers together, or none")
    if params is not None and layers is not None:
        if params <= 0 or layers <= 0:
            raise InvalidArgumentError(
                f"linear_coefficient's params and layers must be positive, got {params}, {layers}"
            )
        dense = 2.0 * params / layers
    else:
        dense = 24.0 * float(hidden) ** 2
    pair = 4.0 * hidden
    return dense / (pair / 2 if causal else pair)


def batch_costs(
    lengths: np.ndarray,
    offsets: np.ndarray,
    cost: CostModel = "tokens",
    *,
    linear: float = 0.0,
) -> np.ndarray:
    """The cost of many batches at once from their fragments' lengths.

    Args:
        lengths: every batch's fragment lengths (a document piece inside a sequence, as
            ``cu_seqlens`` cuts them), batch after batch, flat.
        offsets: ``B + 1`` nondecreasing positions: batch ``b`` holds
            ``lengths[offsets[b]:offsets[b + 1]]``.
        cost: ``"tokens"``, ``"attention"`` or a callable over one batch's lengths (an int64
            array) returning a number.
        linear: ``"attention"``'s weight of a token (`linear_coefficient`); 0: attention only.

    Returns:
        Each batch's cost, float64, shape ``(B,)``.

    Raises:
        InvalidArgumentError: bad offsets, a negative length, or an unknown cost.
    """
    lengths = np.asarray(lengths)
    offsets = np.asarray(offsets, dtype=np.int64)
    if lengths.ndim != 1 or offsets.ndim != 1 or len(offsets) < 1:
        raise InvalidArgumentError("batch_costs takes flat lengths and at least one offset")
    if np.any(np.diff(offsets) < 0) or offsets[0] < 0 or offsets[-1] > len(lengths):
        raise InvalidArgumentError(
            f"batch_costs' offsets must be nondecreasing in [0, {len(lengths)}]"
        )
    if len(lengths) and lengths.min() < 0:
        raise InvalidArgumentError("batch_costs' lengths must not be negative")
    if callable(cost):
        lengths = lengths.astype(np.int64, copy=False)
        bounds = zip(offsets[:-1].tolist(), offsets[1:].tolist(), strict=True)
        return np.array([float(cost(lengths[a:b])) for a, b in bounds], dtype=np.float64)
    if cost not in COST_MODELS:
        raise InvalidArgumentError(
            f"batch_costs' cost must be one of {COST_MODELS} or a callable, got {cost!r}"
        )
    x = lengths.astype(np.float64)
    tokens = _segment_sums(x, offsets)
    if cost == "tokens":
        return tokens
    return _segment_sums(x * x, offsets) + float(linear) * tokens


def _segment_sums(values: np.ndarray, offsets: np.ndarray) -> np.ndarray:
    """The sums of ``values[offsets[b]:offsets[b + 1]]`` (empty batches sum to 0)."""
    total = np.concatenate(([0.0], np.cumsum(values)))
    out: np.ndarray = total[offsets[1:]] - total[offsets[:-1]]
    return out


def step_costs(costs: np.ndarray, assignment: np.ndarray) -> np.ndarray:
    """The cost each rank spends at each step: ``costs.ravel()[assignment]``."""
    out: np.ndarray = np.asarray(costs, dtype=np.float64).ravel()[assignment]
    return out


def straggler_overhead(step_costs: np.ndarray) -> float:
    """How much longer the steps take than with perfectly even ranks: the sum over steps of the
    slowest rank's cost over the sum of the mean rank's cost, less 1 (0: no straggler).

    Args:
        step_costs: shape ``(S, R)``: rank ``r``'s cost at step ``s``.

    Raises:
        InvalidArgumentError: not a non-empty 2-D array.
    """
    costs = np.asarray(step_costs, dtype=np.float64)
    if costs.ndim != 2 or costs.size == 0:
        raise InvalidArgumentError(f"straggler_overhead takes (steps, ranks), got {costs.shape}")
    mean = float(costs.mean(axis=1).sum())
    if mean == 0:
        return 0.0
    return float(costs.max(axis=1).sum()) / mean - 1.0


def window_permutation(
    steps: int, *, seed: int, epoch: int = 0, window: int = 0, leg: int = 0, worker: int = 0
) -> np.ndarray:
    """The seeded order of a window's ``steps`` balanced steps: a function of its key alone, so
    the cost order of the steps never becomes a curriculum (``worker``: the DataLoader worker
    whose batches they are)."""
    key = [seed, epoch, window, BALANCE, *([leg, worker] if leg or worker else [])]
    return np.random.default_rng(key).permutation(steps)


def _check_window(costs: np.ndarray) -> np.ndarray:
    costs = np.asarray(costs, dtype=np.float64)
    if costs.ndim != 2 or costs.shape[0] < 1 or costs.shape[1] < 1:
        raise InvalidArgumentError(f"a window's costs must be (steps, ranks), got {costs.shape}")
    if not np.all(np.isfinite(costs)):
        raise InvalidArgumentError("a window's costs must be finite")
    return costs


def balance_window(
    costs: np.ndarray, *, seed: int, epoch: int = 0, window: int = 0, leg: int = 0, worker: int = 0
) -> np.ndarray:
    """Which batch each (step, rank) slot of a window takes, moving batches between ranks.

    The window's ``R * W`` batches are sorted by cost (ties by plan order) and cut into ``W``
    groups of ``R`` consecutive ones, one group a step. Among all ways to give every batch to
    one slot this minimises the sum over steps of the slowest rank's cost (so the straggler
    overhead, the sum of the means being fixed): with the costs ``x_1 >= x_2 >= ...``, the top
    ``(k-1) R + 1`` of them fill at least ``k`` steps, so the ``k``-th dearest step of any
    assignment costs at least ``x_{(k-1) R + 1}``, which the sorted groups attain. The groups
    then go to the steps in `window_permutation`'s order (no curriculum). Inside a step a batch
    stays on the rank it was planned for where it can (fewest batches read by another rank).

    Args:
        costs: shape ``(W, R)``: the cost of the batch rank ``r`` would take at step ``s`` of the
            window in plan order (a last partial window has fewer steps).
        seed: the loader's seed.
        epoch: the epoch.
        window: the window's number in the epoch.
        leg: elastic resumes before this leg of the epoch.
        worker: the DataLoader worker whose batches these are.

    Returns:
        Shape ``(W, R)`` int64: slot ``(s, r)`` takes batch ``s' * R + r'`` (the batch planned at
        ``(s', r')``, an index into ``costs.ravel()``); every batch exactly once.

    Raises:
        InvalidArgumentError: ``costs`` is not a non-empty 2-D array of finite numbers.
    """
    costs = _check_window(costs)
    steps, ranks = costs.shape
    order = np.argsort(costs.ravel(), kind="stable").reshape(steps, ranks)
    groups = _keep_ranks(order, ranks)
    perm = window_permutation(steps, seed=seed, epoch=epoch, window=window, leg=leg, worker=worker)
    out: np.ndarray = groups[perm]
    return out


def _keep_ranks(groups: np.ndarray, ranks: int) -> np.ndarray:
    """Each step's group of batches laid out over ranks: a batch planned for rank ``r`` sits at
    ``r`` when it is the group's first batch of ``r`` (as many as can stay do), the others fill
    the free ranks in order."""
    steps = groups.shape[0]
    planned = groups % ranks
    step_of = np.repeat(np.arange(steps), ranks)
    pairs = step_of * ranks + planned.ravel()
    _, first = np.unique(pairs, return_index=True)
    stays = np.zeros(groups.size, dtype=bool)
    stays[first] = True
    out = np.full((steps, ranks), -1, dtype=np.int64)
    out[step_of[stays], planned.ravel()[stays]] = groups.ravel()[stays]
    free = np.flatnonzero(out.ravel() < 0)  # (by step, then rank: as the movers below)
    out.ravel()[free] = groups.ravel()[~stays]
    return out


def reorder_window(
    costs: np.ndarray, *, seed: int, epoch: int = 0, window: int = 0, leg: int = 0, worker: int = 0
) -> np.ndarray:
    """Which batch each (step, rank) slot takes when every rank keeps its own batches and only
    reorders them (for comparison with `balance_window`).

    Every rank sorts its batches by cost and the ``k``-th cheapest of each go to the same step;
    that minimises the sum over steps of the slowest rank among reorders of each rank's own
    batches (``k`` steps hold a rank's ``k`` dearest batches, so the ``k``-th dearest step
    costs at least every rank's ``k``-th dearest). The steps follow `window_permutation`.

    Args and Returns: as `balance_window`; here slot ``(s, r)`` always takes a batch of rank
    ``r``.

    Raises:
        InvalidArgumentError: ``costs`` is not a non-empty 2-D array of finite numbers.
    """
    costs = _check_window(costs)
    steps, ranks = costs.shape
    own = np.argsort(costs, axis=0, kind="stable")  # (each rank's steps, cheapest first)
    sorted_ = own * ranks + np.arange(ranks)
    perm = window_permutation(steps, seed=seed, epoch=epoch, window=window, leg=leg, worker=worker)
    out: np.ndarray = sorted_[perm]
    return out


def balance_epoch(
    costs: np.ndarray,
    *,
    window: int,
    seed: int,
    epoch: int = 0,
    leg: int = 0,
    worker: int = 0,
    across_ranks: bool = True,
) -> np.ndarray:
    """An epoch's steps balanced window by window, the windows in their planned order (the
    last may be partial).

    Args:
        costs: shape ``(S, R)``: the cost of every rank's batch at every step, in plan order.
        window: steps a window.
        seed: the loader's seed.
        epoch: the epoch.
        leg: elastic resumes before this leg of the epoch.
        worker: the DataLoader worker whose batches these are.
        across_ranks: `balance_window` (``True``) or `reorder_window` (each rank its own).

    Returns:
        Shape ``(S, R)`` int64: slot ``(s, r)`` takes batch ``costs.ravel()[out[s, r]]``.

    Raises:
        InvalidArgumentError: ``window < 1`` or bad ``costs``.
    """
    if isinstance(window, bool) or not isinstance(window, int) or window < 1:
        raise InvalidArgumentError(f"a balance window must be a positive int, got {window!r}")
    costs = np.asarray(costs, dtype=np.float64)
    if costs.ndim != 2:
        raise InvalidArgumentError(f"an epoch's costs must be (steps, ranks), got {costs.shape}")
    steps, ranks = costs.shape
    arrange = balance_window if across_ranks else reorder_window
    out = np.empty((steps, ranks), dtype=np.int64)
    for index, start in enumerate(range(0, steps, window)):
        stop = min(start + window, steps)
        part = arrange(
            costs[start:stop], seed=seed, epoch=epoch, window=index, leg=leg, worker=worker
        )
        out[start:stop] = part + start * ranks
    return out
