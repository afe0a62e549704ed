"""A packed stream's reading: the documents of its pieces (token ranges of chunks) as
`Fragments` (docs/adr/0022-packed-sequences.md); `stream.packing` arranges them into sequences."""

from __future__ import annotations

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
        self, runs: Iterable[tuple[list[Piece], np.ndarray | DocumentRest | None]]
    ) -> Iterator[Fragments]:
        """The tokens of ``runs``: each run is its pieces in tokens, and which of their tokens
        to take (``None``: all; a `DocumentRest`: worked out from the documents read)."""
        for pieces, select in runs:
            if select is None:  # (each piece as read: the block joins them, one copy)
                yield from map(self._piece, pieces)
                continue
            assert isinstance(select, DocumentRest), "packed runs take pieces or a rest"
            # What an earlier leg left of a block: the block again, as that leg had it.
            rows = Fragments.concat([self._piece(piece) for piece in pieces])
            order = select.permutation(len(rows.begin))
            left = rows.permuted(order).slice(select.read).in_values_order()
            yield left.slice(select.first, select.last - select.first)

    def _piece(self, piece: Piece) -> Fragments:
        whole = Piece(piece.chunk, 0, int(self.chunk_rows[piece.chunk]))
        document = int(self.first_document[piece.chunk])
        read = []
        for batch in self.reader.read([([whole], None)]):
            tokens = batch.column(self.column)
            read.append(Fragments.from_lists(tokens, document, self.eos, self.source))
            document += batch.num_rows
        fragments = Fragments.concat(read)
        if self.chunk_tokens is not None:
            self._check(piece.chunk, fragments)
        return fragments.slice(piece.start, piece.stop - piece.start)

    def _check(self, index: int, fragments: Fragments) -> None:
        """Refuse a chunk whose tokens are not as many as the census counted."""
        assert self.chunk_tokens is not None
        counted, read = int(self.chunk_tokens[index]), len(fragments)
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
