"""A packed stream's reading (`stream.tokens.TokenReader`): a piece's chunk is read whole and its
documents numbered in plan order, with their ``eos`` and source; the piece's token range is
taken from them, cutting documents where it cuts. (What an elastic resume leaves of a block:
tests/multiproc/test_packing.py.)"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

import numpy as np
import pyarrow as pa

from tests.unit.stream.checks import triples
from torch_dataloader_utils.planning import Piece
from torch_dataloader_utils.stream.fragments import Fragments
from torch_dataloader_utils.stream.tokens import TokenReader

CHUNKS = [[[1, 2, 3], [4, 5]], [[6], None, [7, 8, 9, 10]]]


class Chunks:
    """A reader of rows whose chunks are `CHUNKS`, each read in batches of two rows."""

    local = True
    on_error = "raise"

    def __init__(self) -> None:
        self.read_chunks: list[int] = []
        self.batches = 0  # batches decoded

    def read(self, parts: Iterable[tuple[list[Piece], Any]]) -> Iterator[pa.RecordBatch]:
        for pieces, _ in parts:
            for piece in pieces:
                docs = CHUNKS[piece.chunk][piece.start : piece.stop]
                self.read_chunks.append(piece.chunk)
                for at in range(0, len(docs), 2):
                    self.batches += 1
                    yield pa.record_batch(
                        {"tokens": pa.array(docs[at : at + 2], pa.list_(pa.int64()))}
                    )

    def recent_files(self) -> list[str]:
        return ["a.parquet"]


def reader(**kw: Any) -> tuple[TokenReader, Chunks]:
    rows = Chunks()
    return TokenReader(rows, "tokens", np.array([len(c) for c in CHUNKS]), **kw), rows


def test_a_pieces_tokens_with_their_documents_and_positions() -> None:
    tokens, rows = reader(eos=-1, source=3)
    # Chunk 0 with eos: 1 2 3 -1 | 4 5 -1; the piece takes tokens 1-5.
    first = Fragments.concat(list(tokens.read([([Piece(0, 1, 6)], None)])))
    assert triples(first) == [(2, 0, 1), (3, 0, 2), (-1, 0, 3), (4, 1, 0), (5, 1, 1)]
    assert first.source is not None and set(first.source.tolist()) == {3}
    # Chunk 1's documents come after chunk 0's two; a null row is an empty document, no eos.
    second = Fragments.concat(list(tokens.read([([Piece(1, 0, 7)], None)])))
    assert triples(second) == [
        (6, 2, 0),
        (-1, 2, 1),
        (7, 4, 0),
        (8, 4, 1),
        (9, 4, 2),
        (10, 4, 3),
        (-1, 4, 4),
    ]
    assert rows.read_chunks == [0, 1]
    assert tokens.recent_files() == ["a.parquet"] and tokens.local


def test_a_piece_comes_in_its_chunks_decoded_batches_not_joined() -> None:
    """Each decoded batch's documents are a part of their own, over the batch's own values:
    the block joins the parts, the one copy of the tokens."""
    tokens, _ = reader()
    # Chunk 1 is read as two batches: [6] and null, then [7, 8, 9, 10]; the piece cuts both.
    parts = list(tokens.read([([Piece(1, 0, 3)], None)]))
    assert [triples(f) for f in parts] == [[(6, 2, 0)], [(7, 4, 0), (8, 4, 1)]]
    assert parts[0].buffers[0] is not parts[1].buffers[0]
    # A piece of no tokens is one empty part.
    (empty,) = tokens.read([([Piece(0, 2, 2)], None)])
    assert len(empty) == 0


def test_a_piece_ending_inside_its_chunk_leaves_the_rest_undecoded() -> None:
    """A stream that ends inside a chunk (the next stream's part of it) stops decoding there,
    unless the whole chunk's count is checked (a tokenized source's census) or failed rows
    are replaced at the chunk's end (``on_error="skip"``)."""
    tokens, rows = reader()
    # Chunk 1: batch [6] + null (1 token), then [7, 8, 9, 10]: tokens 0-1 are in the first.
    (part,) = tokens.read([([Piece(1, 0, 1)], None)])
    assert triples(part) == [(6, 2, 0)] and rows.batches == 1
    checked, rows = reader(chunk_tokens=[5, 5])
    (part,) = checked.read([([Piece(1, 0, 1)], None)])
    assert triples(part) == [(6, 2, 0)] and rows.batches == 2
    skipping, rows = reader()
    rows.on_error = "skip"
    (part,) = skipping.read([([Piece(1, 0, 1)], None)])
    assert rows.batches == 2


def test_each_piece_of_a_part_is_its_own_fragments() -> None:
    tokens, _ = reader()
    out = list(tokens.read([([Piece(0, 0, 2), Piece(1, 1, 3)], None)]))
    assert [triples(f) for f in out] == [[(1, 0, 0), (2, 0, 1)], [(7, 4, 0), (8, 4, 1)]]
