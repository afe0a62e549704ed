"""Best fit: where a batch's fragments go among its sequences (docs/adr/0022, "Best fit").

A best-fit batch is the next ``budget`` tokens of the stream's token order, as a concat batch is
the next ``batch_size * seq_len``: the planner, the streams and resume are those of concat, and
only the arrangement inside a batch differs. A batch's fragment is a document's tokens in the
batch, split where it must into fragments of one sequence each. `place` decides it from the
batch's fragments' lengths alone (best-fit decreasing), so it is a pure function of the batch;
`stream.packing.pack_best_fit` copies the tokens to where it says.
"""

from __future__ import annotations

from bisect import bisect_left, insort
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

__all__ = ["Placement", "place", "sequences_for"]


def sequences_for(tokens: int, batch_size: int, budget: int) -> int:
    """Sequences a batch of ``tokens`` is arranged in: ``batch_size`` for a whole batch
    (``budget`` tokens); a stream's short last batch gets the same share of room per token,
    ``ceil(tokens * batch_size / budget)``, so it splits no more than a whole one would."""
    # (budget <= batch_size * seq_len, so these sequences always hold the tokens)
    return min(batch_size, max(1, -(-tokens * batch_size // budget)))


@dataclass(frozen=True)
class Placement:
    """Where the batch's fragments go, each as one or more placed fragments (its tokens in one
    sequence), in output order (by sequence, then from its start).

    Attributes:
        sequence: the sequence each placed fragment goes to.
        start: where it starts in the flattened sequences (``sequence * seq_len + at``).
        item: the batch's fragment it is of (an index into ``lengths``).
        offset: where it starts in that fragment.
        length: its tokens.
        filled: tokens each sequence holds (the rest is padding, at its end).
    """

    sequence: np.ndarray
    start: np.ndarray
    item: np.ndarray
    offset: np.ndarray
    length: np.ndarray
    filled: np.ndarray


def place(lengths: Sequence[int], seq_len: int, rows: int) -> Placement:
    """Best-fit decreasing of fragments of ``lengths`` tokens into ``rows`` sequences of
    ``seq_len``: longest first (ties in batch order), each into the sequence with the least room
    that holds it whole (ties: the first). One that fits nowhere whole (or is longer than
    ``seq_len``) fills the sequence with the most room and goes on with its rest the same way.
    The lengths must sum to at most ``rows * seq_len``."""
    assert sum(lengths) <= rows * seq_len, "more tokens than the sequences hold"
    # Sequences with room, as (room, sequence) in order: a bisect finds the best fit. Full
    # ones leave the list; empty ones are taken first-index-first, so the used are a prefix.
    free = [(seq_len, j) for j in range(rows)]
    filled = [0] * rows
    placed: list[tuple[int, int, int, int, int]] = []  # (start, sequence, item, offset, length)
    for i in sorted(range(len(lengths)), key=lengths.__getitem__, reverse=True):  # (stable)
        rest, done = lengths[i], 0
        while rest:
            k = bisect_left(free, (rest, -1))
            if k == len(free):  # whole nowhere: the roomiest (its first sequence)
                k = bisect_left(free, (free[-1][0], -1))
            room, j = free.pop(k)
            take = min(rest, room)
            placed.append((j * seq_len + filled[j], j, i, done, take))
            filled[j] += take
            if room > take:
                insort(free, (room - take, j))
            rest -= take
            done += take
    placed.sort()
    table = np.array(placed, np.int64).reshape(-1, 5).T
    return Placement(
        table[1],
        table[0],
        table[2],
        table[3],
        table[4],
        np.array(filled, np.int64),
    )
