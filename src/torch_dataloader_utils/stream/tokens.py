"""A packed stream's reading: the documents of its pieces (token ranges of chunks) as
`Fragments` (docs/adr/0022-packed-sequences.md); `stream.packing` arranges them into sequences."""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator, Sequence

import numpy as np

from ..errors import DataError
from ..planning import Piece
from ..planning.sequence import DocumentRest
from .fragments import Fragments
from .read import Reader

__all__ = ["TokenReader"]


class TokenReader:
    """Reads a packed stream's pieces (token ranges of chunks) as `Fragments`.

    Args:
        reader: the source's reader of rows.
        column: the token-list column.
        chunk_rows: rows of each chunk (after the filter): a piece's chunk is read whole.
        eos: a token appended after each document, or ``None``.
        source: a mixture's source this reads (its documents carry it), or ``None``.
        chunk_tokens: the tokens the census counted in each chunk (a source tokenized in the
            loader): a chunk read with another count is a `DataError` (``None``: unchecked).
    """

    def __init__(
        self,
        reader: Reader,
        column: str,
        chunk_rows: np.ndarray,
        eos: int | None = None,
        source: int | None = None,
        *,
        chunk_tokens: Sequence[int] | np.ndarray | None = None,
    ) -> None:
        self.reader = reader
        self.chunk_tokens = chunk_tokens
        self.column = column
        self.eos = eos
        self.source = source
        self.chunk_rows = np.asarray(chunk_rows, dtype=np.int64)
        # The number of each chunk's first document: documents are numbered in plan order.
        self.first_document = np.cumsum(self.chunk_rows) - self.chunk_rows

    def read(
        self,
        runs: Iterable[tuple[list[Piece], np.ndarray | DocumentRest | None]],
        first_rows: int = 0,
    ) -> Iterator[Fragments]:
        """The tokens of ``runs``: each run is its pieces in tokens, and which of their tokens
        to take (``None``: all; a `DocumentRest`: worked out from the documents read).
        ``first_rows`` is not used: a packed stream's blocks are counted in tokens."""
        for pieces, select in runs:
            if select is None:  # (each piece's parts as read: the block keeps them)
                for piece in pieces:
                    yield from self._piece(piece)
                continue
            assert isinstance(select, DocumentRest), "packed runs take pieces or a rest"
            # What an earlier leg left of a block: the block again, as that leg had it.
            rows = Fragments.concat([part for piece in pieces for part in self._piece(piece)])
            order = select.permutation(len(rows.begin))
            left = rows.permuted(order).slice(select.read).in_values_order()
            yield left.slice(select.first, select.last - select.first)

    def _piece(self, piece: Piece) -> list[Fragments]:
        """The piece's tokens, in parts: its chunk's documents as each decoded batch holds them,
        not joined. A block keeps its parts' buffers (`Fragments.concat`), and each token is
        copied once, into its sequence (joining each chunk's batches first was a second copy
        of every token, about 15% of a packed stream's reading:
        docs/benchmarks.md#packing-reads-each-token-once; joining the block's, a copy too:
        docs/adr/0037-fragments-over-decoded-buffers.md)."""
        whole = Piece(piece.chunk, 0, int(self.chunk_rows[piece.chunk]))
        document = int(self.first_document[piece.chunk])
        # The chunk's rest after the piece is not decoded (a stream ending inside a chunk: the
        # next stream's) unless the census's count of the whole chunk is checked, or rows
        # that fail are replaced (`on_error="skip"` settles them at the chunk's end).
        stop = piece.stop if self.chunk_tokens is None and self.reader.on_error == "raise" else -1
        read: list[Fragments] = []
        tokens = 0
        with contextlib.closing(self.reader.read([([whole], None)])) as batches:
            for batch in batches:
                part = Fragments.from_lists(
                    batch.column(self.column), document, self.eos, self.source
                )
                read.append(part)
                document += batch.num_rows
                tokens += len(part)
                if 0 <= stop <= tokens:
                    break
        if self.chunk_tokens is not None:
            self._check(piece.chunk, sum(len(part) for part in read))
        return _sliced(read, piece.start, piece.stop)

    def _check(self, index: int, read: int) -> None:
        """Refuse a chunk whose tokens (``read``) are not as many as the census counted."""
        assert self.chunk_tokens is not None
        counted = int(self.chunk_tokens[index])
        if read != counted:
            chunk = self.reader.chunks[index]
            raise DataError(
                f"{self.reader.fs.url(chunk.path)} (chunk {chunk.start}:{chunk.stop}): the "
                f"tokenizer gave {read} tokens, the census counted {counted}: a tokenizer "
                "must give the same tokens every time (one whose vocabulary or rules changed "
                "needs a new fingerprint, and a new census)"
            )

    def recent_files(self) -> list[str]:
        """The files read last (for errors)."""
        return self.reader.recent_files()

    @property
    def local(self) -> bool:
        """Whether the files are on a local filesystem."""
        return self.reader.local


def _sliced(parts: list[Fragments], start: int, stop: int) -> list[Fragments]:
    """Tokens ``[start, stop)`` of ``parts`` one after the other, as the parts' slices (an
    empty range: one empty part, as a piece always read as one)."""
    out = []
    at = 0
    for part in parts:
        n = len(part)
        lo, hi = max(start, at), min(stop, at + n)
        if lo < hi:
            out.append(part.slice(lo - at, hi - lo))
        at += n
        if at >= stop:
            break
    return out or [part.slice(0, 0) for part in parts[:1]]
