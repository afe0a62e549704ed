"""Every best-fit packed batch's fragment lengths from the plan and a length index, without
data (issue 45): `planning.pack_lengths.batch_pieces` gives each batch's pieces of documents,
and the batch's arrangement is `best_fit.place`'s, a pure function of them. Here, not in
``planning``, because the arrangement lives in ``stream`` (planning never imports stream).
"""

from __future__ import annotations

import numpy as np

from ..errors import InvalidArgumentError
from ..planning.pack_lengths import Indexes, batch_pieces
from ..planning.streams import Stream
from .best_fit import place, sequences_for

__all__ = ["best_fit_fragments"]


def best_fit_fragments(
    stream: Stream, index: Indexes, *, seq_len: int, batch_size: int
) -> tuple[np.ndarray, np.ndarray]:
    """The fragment lengths of every batch ``stream`` yields in its pass under
    ``Packing(method="best_fit")``, from the start of the pass: each batch's placed fragments
    in output order (by sequence, then from its start), exactly ``diff(cu_seqlens)`` with each
    sequence's padding left out.

    Args:
        stream: a best-fit packed stream (`Streams.resolve`).
        index: the dataset's documents' tokens (`planning.pack_lengths.DocumentIndex.of`); a
            mixture's: each source's, in the mixture's order.
        seq_len: the packing's ``seq_len``.
        batch_size: sequences a batch (the loader's ``batch_size``).

    Returns:
        ``(lengths, offsets)``: batch ``b``'s fragments are ``lengths[offsets[b]:offsets[b +
        1]]`` (int64).

    Raises:
        InvalidArgumentError: a stream whose batches are not ``batch_size`` sequences of at most
            ``seq_len`` tokens of its order, or as `planning.pack_lengths.batch_pieces`.
    """
    budget = stream.layout.batch_size
    if stream.layout.seq_tokens * batch_size != budget or stream.layout.seq_tokens > seq_len:
        raise InvalidArgumentError(
            f"best_fit_fragments needs a best-fit stream of {batch_size} sequences of "
            f"{seq_len}: its batches are {budget} tokens of sequences of "
            f"{stream.layout.seq_tokens}"
        )
    pieces, offsets = batch_pieces(stream, index)
    out: list[np.ndarray] = []
    counts = np.zeros(len(offsets), np.int64)
    for b, (lo, hi) in enumerate(zip(offsets[:-1].tolist(), offsets[1:].tolist(), strict=True)):
        lengths = pieces[lo:hi]
        n = int(lengths.sum())
        # (As `packing.pack_best_fit` sizes a batch: a stream's short last one takes fewer.)
        rows = batch_size if n >= budget else sequences_for(n, batch_size, budget)
        placed = place(lengths.tolist(), seq_len, rows).length
        out.append(np.asarray(placed, dtype=np.int64))
        counts[b + 1] = len(placed)
    flat = np.concatenate(out) if out else np.zeros(0, np.int64)
    return flat, np.cumsum(counts)
