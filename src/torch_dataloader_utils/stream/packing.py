"""Packed sequences: the epoch as a token order (work in progress, issue 30).

The design (docs/adr draft in the packing branch): a packed dataset plans each chunk's token
count, and the existing streams cut the epoch's token sequence exactly as they cut rows, with a
batch of ``batch_size * seq_len`` tokens. A worker reads its chunks' rows and lays each row's
tokens out as rows of their own (`explode`: the token, the document it belongs to, its position
in the document); a block is shuffled by whole documents (`document_order`), and every
``seq_len`` token rows are a sequence (`pack`). Every token is read once because every token row
is, and every rank has the same batches because the streams are cut in tokens.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa

__all__ = ["PACKED_COLUMNS", "Packed", "document_order", "explode", "pack"]

# The columns of an exploded batch: one row per token.
PACKED_COLUMNS = ("input_ids", "document", "position")


def explode(tokens: pa.Array, first_document: int) -> pa.RecordBatch:
    """One row per token of ``tokens`` (a list array, one document per row): the token, its
    document's number (``first_document`` + the row) and its position in the document.

    Null lists hold no token (an empty document).
    """
    if isinstance(tokens, pa.ChunkedArray):
        tokens = tokens.combine_chunks()
    offsets = np.asarray(tokens.offsets, dtype=np.int64)
    if tokens.offset:  # a sliced array: its offsets start where the slice does
        offsets = offsets[: len(tokens) + 1]
    lengths = np.diff(offsets)
    if tokens.null_count:
        lengths = np.where(np.asarray(tokens.is_null()), 0, lengths)
    values = tokens.flatten()
    total = int(lengths.sum())
    documents = np.repeat(np.arange(len(tokens), dtype=np.int64) + first_document, lengths)
    starts = np.repeat(np.cumsum(lengths) - lengths, lengths)
    positions = np.arange(total, dtype=np.int64) - starts
    return pa.record_batch(
        [values, pa.array(documents), pa.array(positions.astype(np.int32))],
        names=list(PACKED_COLUMNS),
    )


def document_order(documents: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """A permutation of token rows that keeps each document's tokens together and in order,
    the documents in random order (``documents``: each token row's document, each document's
    rows contiguous)."""
    n = len(documents)
    if not n:
        return np.zeros(0, np.int64)
    starts = np.flatnonzero(np.r_[True, documents[1:] != documents[:-1]])
    lengths = np.diff(np.r_[starts, n])
    order = rng.permutation(len(starts))
    first = np.repeat(starts[order], lengths[order])
    within = np.arange(n) - np.repeat(np.cumsum(lengths[order]) - lengths[order], lengths[order])
    out: np.ndarray = first + within
    return out


@dataclass(frozen=True)
class Packed:
    """A batch of packed sequences.

    Attributes:
        input_ids: ``[batch, seq_len]`` tokens (the last sequence of a stream padded).
        position_ids: each token's position in its document (continued across sequences).
        document_ids: each token's document, numbered from 0 in the batch (-1: padding).
        cu_seqlens: int32 ``[k + 1]``: where each document fragment starts in the flattened
            batch, a fragment also starting at every sequence start; then the total.
        max_seqlen: the longest fragment.
        padding: padded tokens in the batch.
    """

    input_ids: np.ndarray
    position_ids: np.ndarray
    document_ids: np.ndarray
    cu_seqlens: np.ndarray
    max_seqlen: int
    padding: int


def pack(
    tokens: np.ndarray,
    documents: np.ndarray,
    positions: np.ndarray,
    seq_len: int,
    *,
    pad_value: int = 0,
) -> Packed:
    """``tokens`` (with each one's document and position) as sequences of ``seq_len``; the
    last one padded with ``pad_value`` (its own fragment in ``cu_seqlens``)."""
    n = len(tokens)
    rows = -(-n // seq_len) if n else 0
    padding = rows * seq_len - n
    ids = np.full(rows * seq_len, pad_value, dtype=tokens.dtype if n else np.int64)
    ids[:n] = tokens
    position_ids = np.zeros(rows * seq_len, np.int64)
    position_ids[:n] = positions
    document_ids = np.full(rows * seq_len, -1, np.int64)
    # A fragment starts where the document changes and at every sequence start.
    change = np.r_[True, documents[1:] != documents[:-1]] if n else np.zeros(0, bool)
    starts = change.copy()
    starts[::seq_len] = True
    first = np.flatnonzero(starts)
    document_ids[:n] = np.cumsum(change) - 1
    bounds = np.r_[first, n]
    if padding:
        bounds = np.r_[bounds, n + padding]
    cu_seqlens = bounds.astype(np.int32)
    max_seqlen = int(np.diff(bounds).max()) if len(bounds) > 1 else 0
    return Packed(
        ids.reshape(rows, seq_len),
        position_ids.reshape(rows, seq_len),
        document_ids.reshape(rows, seq_len),
        cu_seqlens,
        max_seqlen,
        padding,
    )
