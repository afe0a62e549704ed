"""Packed sequences: the epoch as a token order.

The design (docs/adr/0022-packed-sequences.md): a packed dataset plans each chunk's token
count, and the existing streams cut the epoch's token sequence exactly as they cut rows, with a
batch of ``batch_size * seq_len`` tokens. A worker reads its chunks' rows and lays each row's
tokens out as rows of their own (`explode`: the token, the document it belongs to, its position
in the document); a block is shuffled by whole documents
(`planning.shuffle.document_permutation`), and every ``seq_len`` token rows are a sequence
(`pack`). Every token is read once because every token row
is, and every rank has the same batches because the streams are cut in tokens.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import torch

from ..convert.arrow_values import take
from ..planning import Piece
from ..planning.sequence import DocumentRest
from ..planning.shuffle import document_permutation
from .read import Reader

__all__ = [
    "PACKED_COLUMNS",
    "Packed",
    "PackedCollate",
    "TokenReader",
    "explode",
    "pack",
    "packed_batch",
]

# The columns of an exploded batch: one row per token.
PACKED_COLUMNS = ("input_ids", "document", "position")


def explode(tokens: pa.Array, first_document: int, eos: int | None = None) -> pa.RecordBatch:
    """One row per token of ``tokens`` (a list array, one document per row): the token, its
    document's number (``first_document`` + the row) and its position in the document; with
    ``eos``, that token after each document too.

    Null lists hold no token (an empty document; no ``eos`` either).
    """
    if isinstance(tokens, pa.ChunkedArray):
        tokens = tokens.combine_chunks()
    offsets = np.asarray(tokens.offsets, dtype=np.int64)
    if tokens.offset:  # a sliced array: its offsets start where the slice does
        offsets = offsets[: len(tokens) + 1]
    lengths = np.diff(offsets)
    present = np.ones(len(tokens), bool)
    if tokens.null_count:
        present = ~np.asarray(tokens.is_null())
        lengths = np.where(present, lengths, 0)
    values: pa.Array = tokens.flatten()
    if eos is not None:
        values, lengths = _with_eos(values, lengths, present, eos)
    total = int(lengths.sum())
    documents = np.repeat(np.arange(len(tokens), dtype=np.int64) + first_document, lengths)
    starts = np.repeat(np.cumsum(lengths) - lengths, lengths)
    positions = np.arange(total, dtype=np.int64) - starts
    return pa.record_batch(
        [values, pa.array(documents), pa.array(positions.astype(np.int32))],
        names=list(PACKED_COLUMNS),
    )


def _with_eos(
    values: pa.Array, lengths: np.ndarray, present: np.ndarray, eos: int
) -> tuple[pa.Array, np.ndarray]:
    """``values`` with ``eos`` after each present document, and the documents' new lengths."""
    longer = lengths + present
    ends = np.cumsum(longer)
    out = np.empty(int(ends[-1]) if len(ends) else 0, dtype=values.type.to_pandas_dtype())
    separator = np.zeros(len(out), bool)
    separator[(ends - 1)[present]] = True
    out[~separator] = values.to_numpy(zero_copy_only=False)
    out[separator] = eos
    return pa.array(out, type=values.type), longer


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


class TokenReader:
    """Reads a packed stream's pieces (token ranges of chunks) as token rows (`explode`).

    Args:
        reader: the source's reader of rows.
        column: the token-list column.
        chunk_rows: rows of each chunk (after the filter): a piece's chunk is read whole.
        eos: a token appended after each document, or ``None``.
    """

    def __init__(
        self, reader: Reader, column: str, chunk_rows: np.ndarray, eos: int | None = None
    ) -> None:
        self.reader = reader
        self.column = column
        self.eos = eos
        self.chunk_rows = np.asarray(chunk_rows, dtype=np.int64)
        # The number of each chunk's first document: documents are numbered in plan order.
        self.first_document = np.cumsum(self.chunk_rows) - self.chunk_rows

    def read(
        self, parts: Iterable[tuple[list[Piece], np.ndarray | DocumentRest | None]]
    ) -> Iterator[pa.RecordBatch]:
        """The token rows of ``parts``: each part is pieces in tokens, and which of their token
        rows to take (``None``: all; a `DocumentRest`: worked out from the rows read)."""
        for pieces, select in parts:
            taken = [self._piece(piece) for piece in pieces]
            rows = taken[0] if len(taken) == 1 else pa.concat_batches(taken)
            if isinstance(select, DocumentRest):  # what an earlier leg left of a block
                documents = np.asarray(rows.column("document"))
                order = document_permutation(documents, **dict(select.key))
                yield take(rows, np.sort(order[select.read :])[select.first : select.last])
            else:
                yield rows if select is None else take(rows, select)

    def _piece(self, piece: Piece) -> pa.RecordBatch:
        whole = Piece(piece.chunk, 0, int(self.chunk_rows[piece.chunk]))
        document = int(self.first_document[piece.chunk])
        exploded = []
        for batch in self.reader.read([([whole], None)]):
            exploded.append(explode(batch.column(self.column), document, self.eos))
            document += batch.num_rows
        tokens = exploded[0] if len(exploded) == 1 else pa.concat_batches(exploded)
        return tokens.slice(piece.start, piece.stop - piece.start)

    def recent_files(self) -> list[str]:
        """The files read last (for errors)."""
        return self.reader.recent_files()


def packed_batch(batch: dict[str, Any], seq_len: int, pad_value: int) -> dict[str, Any]:
    """A converted batch of token rows (``input_ids``, ``document``, ``position``: torch
    tensors or numpy arrays) as packed sequences of ``seq_len`` (`pack`)."""
    tokens = batch["input_ids"]
    is_torch = isinstance(tokens, torch.Tensor)
    packed = pack(
        np.asarray(tokens),
        np.asarray(batch["document"]),
        np.asarray(batch["position"]),
        seq_len,
        pad_value=pad_value,
    )
    out: dict[str, Any] = {
        "input_ids": packed.input_ids,
        "position_ids": packed.position_ids,
        "document_ids": packed.document_ids,
        "cu_seqlens": packed.cu_seqlens,
    }
    if is_torch:
        out = {k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in out.items()}
    out["max_seqlen"] = packed.max_seqlen
    return out


@dataclass(frozen=True)
class PackedCollate:
    """A packed dataset's last step in the worker: a batch of token rows as sequences
    (`packed_batch`), then ``then`` (the user's ``collate_fn``, or decoding), if any."""

    seq_len: int
    pad_value: int
    then: Callable[[Any], Any] | None = None

    def __call__(self, batch: dict[str, Any]) -> Any:
        packed = packed_batch(batch, self.seq_len, self.pad_value)
        return packed if self.then is None else self.then(packed)
