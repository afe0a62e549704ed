"""A packed batch's rows (`packed_rows`): the fragments of documents it holds, in token order.

A packed stream's block is shuffled by whole documents, so the order of its tokens depends on
its documents' lengths, which only the data tells: the blocks a batch is in are read (their
token column alone), and the last ones kept (`KEPT_FRAGMENTS`) without their tokens, so that
looking up the batches after it reads nothing more.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections import OrderedDict
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa

from ..batching import Packing
from ..planning import Piece
from ..planning.sequence import DocumentRest, cut
from ..planning.streams import SourceRows, Stream
from ..stream.fragments import Fragments, goes_on
from ..stream.tokens import TokenReader
from .chunk_rows import SOURCE_COLUMN, ChunkRows

__all__ = ["FRAGMENT_START", "FRAGMENT_TOKENS", "KEPT_FRAGMENTS", "packed_rows"]

# The columns of a packed batch's fragments: the tokens of its document each holds, and where in
# its document it starts (its first token's position in it).
FRAGMENT_TOKENS, FRAGMENT_START = "__fragment_tokens__", "__fragment_start__"
# Fragments of the blocks kept (~42 bytes each): a rank's batches in turn are in one or two
# blocks of each worker's stream and source.
KEPT_FRAGMENTS = 1_000_000


def packed_rows(
    stream: Stream,
    index: int,
    *,
    rows: ChunkRows,
    packing: Packing,
    blocks: OrderedDict[tuple[Any, ...], Fragments],
    columns: Sequence[str],
) -> pa.Table:
    """Packed batch ``index`` of ``stream`` as the fragments of documents it holds, in order:
    ``columns`` of each one's document, its `FRAGMENT_TOKENS` and `FRAGMENT_START`, the
    document's file and row, and in a mixture its source (each sequence is one source's).
    ``blocks``: the blocks looked up last (kept here)."""
    first = index * stream.layout.batch_size
    stop = min(first + stream.layout.batch_size, stream.length)
    looked = _Blocks(stream, rows, packing, blocks)
    if stream.interleave is None:
        return looked.table(0, first, stop, columns)
    at = stream.first + first
    labels = stream.interleave.labels(at, stream.first + stop)
    before = (stream.interleave.prefix(at) - stream.interleave.prefix(stream.first)).tolist()
    bounds = [0, *(np.flatnonzero(np.diff(labels)) + 1).tolist(), len(labels)]
    tables = []
    for a, b in itertools.pairwise(bounds):  # each run of one source's sequences
        i = int(labels[a])
        table = looked.table(i, before[i], before[i] + b - a, columns)
        tables.append(table.append_column(SOURCE_COLUMN, pa.array(np.full(len(table), i))))
        before[i] += b - a
    return pa.concat_tables(tables)


@dataclass
class _Blocks:
    """The blocks of one stream's sources, read as the stream delivers them."""

    stream: Stream
    rows: ChunkRows
    packing: Packing
    kept: OrderedDict[tuple[Any, ...], Fragments]

    def table(self, i: int, first: int, stop: int, columns: Sequence[str]) -> pa.Table:
        """The fragments of source ``i``'s tokens ``[first, stop)`` of the stream, counted in
        the order the stream delivers them, with ``columns`` of their documents."""
        source_rows = self.stream.sources[i]
        order = self.stream.order_of(source_rows)
        fragments: list[Fragments] = []
        at = first
        while at < stop:
            # (Not shuffled: no blocks, the tokens themselves.)
            bounds = order.block_of(at) if order.layout.shuffle else (-1, at, stop)
            _, start, end = bounds
            fragments.append(
                self._block(i, source_rows, bounds).slice(at - start, min(end, stop) - at)
            )
            at = min(end, stop)
        lengths, document, position = _joined(fragments)
        plan = self.rows.sources[i].plan
        chunk_rows = np.asarray(plan.chunk_rows, dtype=np.int64)
        firsts = np.cumsum(chunk_rows) - chunk_rows  # (each chunk's first document's number)
        chunks = np.searchsorted(firsts, document, side="right") - 1
        table = self.rows.table(i, chunks, document - firsts[chunks], columns)
        table = table.add_column(len(columns), FRAGMENT_START, pa.array(position, pa.int64()))
        return table.add_column(len(columns), FRAGMENT_TOKENS, pa.array(lengths, pa.int64()))

    def _block(self, i: int, rows: SourceRows, bounds: tuple[int, int, int]) -> Fragments:
        """Block ``bounds`` (its index, first and last row; index -1: rows not shuffled) of
        ``rows`` in the order the stream delivers it, its tokens left out."""
        stream = self.stream
        pass_ = stream.pass_
        block, start, end = bounds
        key: tuple[Any, ...] = (pass_.epoch, pass_.legs, pass_.steps)
        key += (stream.topology, stream.layout, i, block, *((start, end) if block < 0 else ()))
        found = self.kept.get(key)
        if found is not None:
            self.kept.move_to_end(key)
            return found
        runs = [rows.order.run_pieces(run) for run in cut(rows.runs, start, end)]
        chunk_rows = self.rows.sources[i].plan.chunk_rows  # (documents)
        reader = self.rows.reader(i, (self.packing.column,))
        mixed = i if len(self.rows.sources) > 1 else None
        tokens = TokenReader(reader, self.packing.column, chunk_rows, self.packing.eos_token, mixed)
        chunks = _ChunkTokens(tokens, rows.order.chunk_rows)
        read = Fragments.concat(list(chunks.read(runs)))
        if block >= 0:
            read = read.permuted(stream.order_of(rows).documents(block, len(read.begin)))
        # (A lookup needs the fragments' lengths, not their tokens.)
        empty = tuple(b[:0] for b in read.buffers)
        found = self.kept[key] = dataclasses.replace(read, buffers=empty)
        while len(self.kept) > 1 and sum(len(f.begin) for f in self.kept.values()) > KEPT_FRAGMENTS:
            self.kept.popitem(last=False)
        return found


class _ChunkTokens:
    """Reads the tokens of a block's pieces, each chunk's documents once: a packed mixture's
    block may hold a small source's chunks many times over (one pass of the source after
    another).

    Args:
        tokens: the source's reader of tokens (it reads a piece's whole chunk).
        chunk_tokens: tokens of each chunk, in plan order.
    """

    def __init__(self, tokens: TokenReader, chunk_tokens: Sequence[int] | np.ndarray) -> None:
        self.tokens = tokens
        self.chunk_tokens = chunk_tokens
        self._read: dict[int, Fragments] = {}

    def read(
        self, runs: Iterable[tuple[list[Piece], np.ndarray | DocumentRest | None]]
    ) -> Iterator[Fragments]:
        """The tokens of ``runs``, as `TokenReader.read` reads them."""
        for pieces, select in runs:
            if select is not None:  # (what an earlier leg left of a block: read as it says)
                yield from self.tokens.read([(pieces, select)])
                continue
            for piece in pieces:
                whole = self._read.get(piece.chunk)
                if whole is None:
                    chunk = Piece(piece.chunk, 0, int(self.chunk_tokens[piece.chunk]))
                    whole = Fragments.concat(list(self.tokens.read([([chunk], None)])))
                    self._read[piece.chunk] = whole
                yield whole.slice(piece.start, piece.stop - piece.start)


def _joined(fragments: Sequence[Fragments]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The lengths, documents and starts of the fragments of ``fragments`` one after the
    other, a document's that go on one fragment (as `Fragments.concat` joins them)."""
    lengths = np.concatenate([f.end - f.begin for f in fragments])
    document = np.concatenate([f.document for f in fragments])
    position = np.concatenate([f.position for f in fragments])
    on = goes_on(document, position, lengths, None)
    if on.any():
        group = np.cumsum(~on) - 1
        starts = np.flatnonzero(~on)
        lengths = np.bincount(group, weights=lengths).astype(np.int64)
        document, position = document[starts], position[starts]
    return lengths, document, position
