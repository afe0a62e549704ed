"""Every packed batch's fragment lengths from the plan and a length index, without data (pure;
issue 45).

A packed stream's batches (docs/adr/0022-packed-sequences.md) are a pure function of the plan,
the epoch and each document's token count: the stream's token ranges of chunks (its runs'
pieces) hold documents cut at the pieces' ends; its blocks cut them again and move them whole
(`shuffle.document_permutation`, one draw per fragment of the block, a document's fragments
that meet in a block being one); and ``cu_seqlens`` starts a fragment at every document change
and every sequence start. So any process that holds a length index (each document's tokens, in
plan order: chunks in plan order, rows in chunk order) can compute every stream's batches'
fragment lengths (`batch_fragments`), the input of `balance.batch_costs`, without reading a
token or sending a message. A mixture's stream (each sequence one source's tokens) takes
each source's index; best fit places `batch_pieces` by ``stream.best_fit``'s rule, a floor
above this one (`stream.best_fit_lengths`). A block's rest after an elastic resume inside the
epoch is refused: its order depends on its data (docs/adr/0022).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from ..errors import InvalidArgumentError
from .shuffle import BlockOrder
from .streams import SourceRows, Stream

__all__ = ["DocumentIndex", "Indexes", "batch_fragments", "batch_pieces", "document_tokens"]


def document_tokens(
    lengths: np.ndarray, present: np.ndarray | None = None, *, eos: bool = False
) -> np.ndarray:
    """Each document's tokens as a packed stream counts them (int64).

    Args:
        lengths: each row's list length in plan order; a negative one marks a null list (so
            that one int32 a row can tell a null list from an empty one, which ``eos`` needs).
        present: whether each row's list is not null (``None``: those of a length >= 0).
        eos: an ``eos_token`` is appended after each present document (an empty list too).

    Returns:
        The tokens of each document: 0 for a null list, plus one with ``eos``.
    """
    out = np.asarray(lengths, dtype=np.int64).copy()
    valid = out >= 0
    if present is not None:
        valid &= np.asarray(present, dtype=bool)
    out[~valid] = 0
    if eos:
        out += valid
    return out


@dataclass(frozen=True, eq=False)
class DocumentIndex:
    """A packed dataset's length index: each document's tokens, in plan order, and where each
    document and chunk ends in their concatenation (built once, `of`; 16 bytes a document).

    Attributes:
        tokens: each document's tokens (`document_tokens`: ``eos`` included), int64.
        ends: where each document ends in the plan's token order (``cumsum(tokens)``).
        chunk_starts: where each chunk's first document starts in it.
        chunk_tokens: each chunk's tokens.
    """

    tokens: np.ndarray
    ends: np.ndarray
    chunk_starts: np.ndarray
    chunk_tokens: np.ndarray

    @classmethod
    def of(cls, tokens: np.ndarray, chunk_documents: np.ndarray) -> DocumentIndex:
        """The index of documents of ``tokens`` tokens, ``chunk_documents`` a chunk (in plan
        order: the row plan's ``chunk_rows``, after any filter).

        Raises:
            InvalidArgumentError: the chunks' documents are not as many as ``tokens``.
        """
        tokens = np.asarray(tokens, dtype=np.int64)
        documents = np.asarray(chunk_documents, dtype=np.int64)
        if int(documents.sum()) != len(tokens) or (len(tokens) and tokens.min() < 0):
            raise InvalidArgumentError(
                f"the length index holds {len(tokens)} documents, the chunks "
                f"{int(documents.sum())}: give each row's tokens (none negative) in plan order"
            )
        ends = np.cumsum(tokens)
        starts = np.r_[np.int64(0), ends][np.cumsum(documents) - documents]
        chunk_tokens = np.diff(np.r_[starts, ends[-1] if len(ends) else 0])
        return cls(tokens, ends, starts, chunk_tokens)


# A length index: one source's, or each source's of a mixture (in its order).
Indexes = DocumentIndex | Sequence[DocumentIndex]


def batch_pieces(stream: Stream, index: Indexes) -> tuple[np.ndarray, np.ndarray]:
    """The pieces of documents of every batch ``stream`` yields in its pass, from the start of
    the pass: a document's tokens in the batch, in the batch's token order (what best fit
    places, `stream.best_fit_lengths`; concat cuts them again at its sequences' starts).

    Args:
        stream: a packed stream (`Streams.resolve` of a packed dataset).
        index: the dataset's documents' tokens (`DocumentIndex.of`); a mixture's: each
            source's, in the mixture's order.

    Returns:
        ``(lengths, offsets)``: batch ``b``'s pieces are ``lengths[offsets[b]:offsets[b + 1]]``
        (int64), for the ``stream.batches`` batches (a resumed pass yields those from
        ``stream.done`` on).

    Raises:
        InvalidArgumentError: a token budget, a stream not packed, the rest of a block after
            an elastic resume (only its data tells its order), or a length index whose chunks'
            tokens are not the plan's (or not one a source).
    """
    batch = stream.layout.batch_size
    begin, length = _split(_stream_order(stream, index), batch)
    offsets = np.searchsorted(begin, np.arange(stream.batches + 1, dtype=np.int64) * batch)
    return length[: offsets[-1]], offsets.astype(np.int64)


def batch_fragments(
    stream: Stream, index: Indexes, *, seq_len: int, method: str = "concat"
) -> tuple[np.ndarray, np.ndarray]:
    """The fragment lengths of every batch ``stream`` yields in its pass (concat packing),
    from the start of the pass: exactly ``diff(cu_seqlens)`` over each batch's tokens (its
    padding left out; ``positions`` and ``static_shape`` change neither).

    Args:
        stream: a packed stream (`Streams.resolve` of a packed dataset).
        index: the dataset's documents' tokens (`DocumentIndex.of`); a mixture's: each
            source's, in the mixture's order.
        seq_len: the packing's ``seq_len``.
        method: the packing's method: only ``"concat"`` (best fit:
            `stream.best_fit_lengths.best_fit_fragments`).

    Returns:
        ``(lengths, offsets)``: batch ``b``'s fragments are ``lengths[offsets[b]:offsets[b +
        1]]`` (int64), for the ``stream.batches`` batches (a resumed pass yields those from
        ``stream.done`` on).

    Raises:
        InvalidArgumentError: best fit, a stream not packed at ``seq_len``, or as
            `batch_pieces`.
    """
    if method != "concat":
        raise InvalidArgumentError(
            f"batch_fragments predicts concatenation packing, not method={method!r}: best "
            "fit's arrangement is stream.best_fit_lengths.best_fit_fragments'"
        )
    if stream.layout.seq_tokens != seq_len:
        raise InvalidArgumentError(
            f"batch_fragments needs a stream packed at seq_len={seq_len}, got "
            f"seq_tokens={stream.layout.seq_tokens}"
        )
    # Fragments start at every sequence start (batches hold whole sequences but the last).
    begin, length = _split(_stream_order(stream, index), seq_len)
    batch = stream.layout.batch_size
    offsets = np.searchsorted(begin, np.arange(stream.batches + 1, dtype=np.int64) * batch)
    return length[: offsets[-1]], offsets.astype(np.int64)


def _stream_order(stream: Stream, index: Indexes) -> np.ndarray:
    """Where the stream's pieces of documents start in its token order (a document's meeting
    pieces of one source joined), then its tokens."""
    if stream.budget is not None or not stream.layout.seq_tokens:
        raise InvalidArgumentError("batch_fragments predicts packed streams (not token budgets)")
    indexes = [index] if isinstance(index, DocumentIndex) else list(index)
    if len(indexes) != len(stream.sources):
        raise InvalidArgumentError(
            f"batch_fragments needs a length index for each of the {len(stream.sources)} "
            f"sources, got {len(indexes)}"
        )
    bounds = [_source_order(stream, r, i) for r, i in zip(stream.sources, indexes, strict=True)]
    if stream.interleave is None:
        return bounds[0]
    return _interleaved(stream, bounds)


def _source_order(stream: Stream, rows: SourceRows, index: DocumentIndex) -> np.ndarray:
    """Where the stream's pieces of one source's documents start in the order the stream
    delivers that source's tokens (a document's meeting pieces joined), then their tokens."""
    if any(run.rest is not None or run.select is not None for run in rows.runs):
        raise InvalidArgumentError(
            "batch_fragments cannot predict the rest of a packed block an earlier leg left "
            "(its order depends on the block's data): predict a fresh epoch"
        )
    if not np.array_equal(index.chunk_tokens, np.asarray(rows.order.chunk_rows, np.int64)):
        raise InvalidArgumentError(
            "the length index does not add up to the plan's token counts: give each row's "
            "tokens in plan order (chunks in plan order, rows in chunk order), with eos_token's"
        )
    begin, length, document, position = _stream_fragments(rows, index)
    if stream.layout.shuffle:
        order = stream.order_of(rows)
        length, document, position = _shuffled(order, begin, length, document, position)
    length, _, _ = _joined(length, document, position)
    bounds = np.zeros(len(length) + 1, np.int64)
    np.cumsum(length, out=bounds[1:])
    return bounds


def _interleaved(stream: Stream, bounds: list[np.ndarray]) -> np.ndarray:
    """A mixture stream's pieces (`_stream_order`) from each source's (``bounds``): each turn
    (``seq_tokens`` positions) holds the next turn of its source's tokens; a document's pieces
    of two turns of one source that follow each other are one again."""
    assert stream.interleave is not None, "a mixture's stream"
    turn = stream.layout.seq_tokens
    if stream.first % turn:
        raise InvalidArgumentError("a packed mixture's stream starts at a turn")
    turns = -(-stream.length // turn)
    labels = np.asarray(
        stream.interleave.turn_labels(stream.first // turn, stream.first // turn + turns), np.int64
    )
    # Each source's pieces cut at its turns; a cut made here marks a piece that goes on.
    lengths, goes, start, count = [], [], np.zeros(turns, np.int64), np.zeros(turns, np.int64)
    base = 0
    for i, own in enumerate(bounds):
        begin, length = _split(own, turn)
        mine = np.flatnonzero(labels == i)
        offsets = np.searchsorted(begin, np.arange(len(mine) + 1, dtype=np.int64) * turn)
        start[mine] = base + offsets[:-1]
        count[mine] = np.diff(offsets)
        lengths.append(length)
        goes.append(~np.isin(begin, own, assume_unique=True))
        base += len(length)
    index = np.repeat(start - (np.cumsum(count) - count), count) + np.arange(int(count.sum()))
    length = np.concatenate(lengths)[index]
    source = np.repeat(labels, count)
    on = np.concatenate(goes)[index]
    on[1:] &= source[1:] == source[:-1]  # (the previous turn of the stream was its own)
    on[:1] = False
    first = np.flatnonzero(~on)
    length = np.add.reduceat(length, first) if len(first) else length
    out = np.zeros(len(length) + 1, np.int64)
    np.cumsum(length, out=out[1:])
    return out


def _split(bounds: np.ndarray, step: int) -> tuple[np.ndarray, np.ndarray]:
    """The pieces between ``bounds`` (sorted, the last the total) cut at every multiple of
    ``step`` too: each one's start and length."""
    cuts = np.concatenate([bounds, np.arange(0, int(bounds[-1]), step, dtype=np.int64)])
    cuts.sort(kind="stable")  # (two sorted runs: merged)
    cuts = cuts[np.r_[True, cuts[1:] != cuts[:-1]]]
    return cuts[:-1], np.diff(cuts)


def _stream_fragments(
    rows: SourceRows, index: DocumentIndex
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The stream's documents cut at its pieces' ends, in its token order (before blocks):
    each fragment's first stream token, length, document and first position."""
    pieces = [p for run in rows.runs for p in rows.order.run_pieces(run)[0]]
    if not pieces:
        empty = np.zeros(0, np.int64)
        return empty, empty, empty, empty
    chunk, start, stop = (np.array(x, dtype=np.int64) for x in zip(*pieces, strict=True))
    tokens, doc_end = index.tokens, index.ends
    lo = index.chunk_starts[chunk] + start  # (the pieces' token ranges in the plan's order)
    hi = lo + (stop - start)
    first = np.searchsorted(doc_end, lo, side="right")
    last = np.minimum(np.searchsorted(doc_end, hi, side="left"), len(doc_end) - 1)
    count = np.maximum(last - first + 1, 0)
    piece = np.repeat(np.arange(len(pieces)), count)
    within = np.arange(len(piece)) - np.repeat(np.cumsum(count) - count, count)
    document = first[piece] + within
    doc_begin = doc_end[document] - tokens[document]
    begin = np.maximum(doc_begin, lo[piece])
    end = np.minimum(doc_end[document], hi[piece])
    kept = end > begin  # (empty documents hold no fragment)
    document, begin, end = document[kept], begin[kept], end[kept]
    length = end - begin
    return np.cumsum(length) - length, length, document, begin - doc_begin[kept]


def _shuffled(
    block_order: BlockOrder,
    begin: np.ndarray,
    length: np.ndarray,
    document: np.ndarray,
    position: np.ndarray,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The fragments cut at the stream's block bounds, each block's meeting fragments joined
    and moved by its document permutation (as `stream.blocks.shuffled_blocks` does)."""
    starts = np.array([a for a, _ in block_order.bounds()], dtype=np.int64)
    begin, length, document, position = _cut(begin, length, document, position, starts)
    block = np.searchsorted(starts, begin, side="right") - 1
    length, document, position, block = _joined(length, document, position, block)
    bounds = np.r_[0, np.flatnonzero(np.diff(block)) + 1, len(block)]
    moved = [
        a + block_order.documents(int(block[a]), int(b - a))
        for a, b in zip(bounds[:-1].tolist(), bounds[1:].tolist(), strict=True)
        if b > a
    ]
    index = np.concatenate(moved) if moved else np.zeros(0, np.int64)
    return length[index], document[index], position[index]


def _cut(
    begin: np.ndarray,
    length: np.ndarray,
    document: np.ndarray,
    position: np.ndarray,
    points: np.ndarray,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Contiguous fragments (``begin`` sorted, every length positive) cut at ``points`` too."""
    if not len(begin):
        return begin, length, document, position
    total = int(begin[-1] + length[-1])
    points = points[(points > 0) & (points < total)]
    starts = np.concatenate([begin, points])
    starts.sort(kind="stable")  # (two sorted runs: merged)
    starts = starts[np.r_[True, starts[1:] != starts[:-1]]]
    which = np.searchsorted(begin, starts, side="right") - 1
    lengths = np.diff(np.r_[starts, total])
    return starts, lengths, document[which], position[which] + starts - begin[which]


def _joined(
    length: np.ndarray, document: np.ndarray, position: np.ndarray, *also: np.ndarray
) -> tuple[np.ndarray, ...]:
    """Fragments one after the other, a document's that go on (its positions continued; the
    same value in every array of ``also``) as one (`stream.fragments.goes_on`)."""
    on = np.zeros(len(length), bool)
    on[1:] = (document[1:] == document[:-1]) & (position[1:] == position[:-1] + length[:-1])
    for values in also:
        on[1:] &= values[1:] == values[:-1]
    if not on.any():
        return (length, document, position, *also)
    starts = np.flatnonzero(~on)
    summed = np.add.reduceat(length, starts)
    return (summed, document[starts], position[starts], *(a[starts] for a in also))
