"""The assignment: which rows each stream reads in an epoch. Pure functions of small inputs.

One global row order per epoch (chunks permuted by ``(seed, epoch)``, concatenated) is cut into
equal spans per rank, and each rank's span into contiguous, batch-aligned spans per worker. A span
is then mapped back to pieces ``(chunk, row_start, row_stop)``; only the ends of a span cut inside
a chunk. See ``docs/concepts/model.md``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal, NamedTuple

import numpy as np

from ..errors import InvalidArgumentError

__all__ = [
    "REMAINDER_POLICIES",
    "SPLIT_STRATEGIES",
    "Piece",
    "Remainder",
    "SplitStrategy",
    "rank_span",
    "span_pieces",
    "worker_span",
]

Remainder = Literal["drop", "pad", "uneven"]
REMAINDER_POLICIES: tuple[Remainder, ...] = ("drop", "pad", "uneven")
SplitStrategy = Literal["equal", "round_robin"]
SPLIT_STRATEGIES: tuple[SplitStrategy, ...] = ("equal", "round_robin")


class Piece(NamedTuple):
    """Rows ``[start, stop)`` of chunk number ``chunk`` of the plan.

    A named tuple: a worker's stream of a million-chunk plan makes its pieces in milliseconds,
    where frozen dataclasses took seconds
    (docs/adr/0020-measurements-behind-constants.md#chunks-as-columns).
    """

    chunk: int
    start: int
    stop: int

    @property
    def num_rows(self) -> int:
        """Rows in the piece."""
        return self.stop - self.start


def rank_span(
    total: int,
    *,
    rank: int,
    world_size: int,
    batch_size: int,
    drop_last: bool,
    remainder: Remainder,
) -> tuple[int, int]:
    """Positions ``[start, stop)`` of the global row sequence that ``rank`` reads.

    ``drop`` gives every rank ``total // world_size`` rows; ``pad`` gives every rank
    ``ceil(total / world_size)`` rows, positions past ``total`` wrapping to the start; ``uneven``
    gives the first ``total % world_size`` ranks one row more. ``drop_last`` then trims each
    rank's span to whole batches.
    """
    if remainder == "drop":
        share = total // world_size
        start = rank * share
    elif remainder == "pad":
        share = -(-total // world_size) if total else 0
        start = rank * share
    elif remainder == "uneven":
        base, extra = divmod(total, world_size)
        share = base + (rank < extra)
        start = rank * base + min(rank, extra)
    else:
        raise InvalidArgumentError(
            f"remainder must be one of {REMAINDER_POLICIES}, got {remainder!r}"
        )
    if drop_last:
        share -= share % batch_size
    return start, start + share


def worker_span(
    span: tuple[int, int], *, worker: int, num_workers: int, batch_size: int
) -> tuple[int, int]:
    """The contiguous, batch-aligned range of a rank's span that ``worker`` reads.

    Workers get whole batches, as equal in number as possible (±1); only the last batch of the
    rank, which may be short, makes the last non-empty worker's stream shorter.
    """
    start, stop = span
    num_batches = -(-(stop - start) // batch_size)
    base, extra = divmod(num_batches, num_workers)
    first = worker * base + min(worker, extra)
    last = first + base + (worker < extra)
    return min(start + first * batch_size, stop), min(start + last * batch_size, stop)


def span_pieces(
    rows_in_order: Sequence[int] | np.ndarray,
    order: Sequence[int] | np.ndarray,
    start: int,
    stop: int,
    *,
    ends: np.ndarray | None = None,
) -> list[Piece]:
    """Map positions ``[start, stop)`` of the concatenation to pieces of chunks.

    Args:
        rows_in_order: rows of each chunk, in concatenation order.
        order: the plan index of each chunk in concatenation order.
        start: first position; may be past the total (then it wraps, for padding).
        stop: one past the last position.
        ends: ``cumsum(rows_in_order)``, when the caller has it (it costs O(chunks)).
    """
    rows = np.asarray(rows_in_order, dtype=np.int64)
    if ends is None:
        ends = np.cumsum(rows)
    total = int(ends[-1]) if len(ends) else 0
    if stop <= start or total == 0:
        return []
    chunks = np.asarray(order)
    pieces: list[Piece] = []
    pos = start
    while pos < stop:  # once, or once per wrap (padding)
        at = pos % total
        take = min(total - at, stop - pos)
        pieces.extend(_pieces_between(rows, chunks, ends, at, at + take))
        pos += take
    return pieces


def _pieces_between(
    rows: np.ndarray, order: np.ndarray, ends: np.ndarray, lo: int, hi: int
) -> list[Piece]:
    """The pieces of positions ``[lo, hi)``, ``0 <= lo < hi <= total`` (vectorised: a worker's
    stream of a million-chunk plan maps in milliseconds)."""
    first = int(np.searchsorted(ends, lo, side="right"))
    last = int(np.searchsorted(ends, hi - 1, side="right"))
    index = np.arange(first, last + 1)
    chunk_end = ends[index]
    chunk_start = chunk_end - rows[index]
    a = np.maximum(chunk_start, lo) - chunk_start
    b = np.minimum(chunk_end, hi) - chunk_start
    keep = b > a  # chunks of no rows inside the range give no piece
    return [
        Piece(c, s, e)
        for c, s, e in zip(
            order[index[keep]].tolist(), a[keep].tolist(), b[keep].tolist(), strict=True
        )
    ]
