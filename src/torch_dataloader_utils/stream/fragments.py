"""A packed stream's rows as fragments of documents (`Fragments`): its rows are tokens, but a
worker never lays them out one by one.

A packed dataset's order is one of tokens (docs/adr/0022-packed-sequences.md). The pipeline
groups, shuffles and cuts a stream's rows by position (`stream.blocks`, `stream.batches`); for a
packed stream those rows are held as fragments of documents over one buffer of token values,
so that slicing a token range and shuffling a block by whole documents cost a few operations
per document, not per token. Tokens are copied once, into the sequences (`Fragments.tokens`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from ..convert.arrow_values import filled_values, numpy_view, valid_view

__all__ = ["TOKENS_PER_COPY", "Fragments", "goes_on"]


@dataclass(frozen=True, eq=False, slots=True)
class Fragments:
    """Fragments of documents (a document's tokens within one block, batch or sequence), in
    order; their tokens are the rows (``num_rows``).

    Attributes:
        values: the token values the fragments are ranges of.
        begin, end: each fragment's tokens, ``values[begin:end]`` (int64).
        document: each fragment's document, a number unique in the epoch (int64).
        position: where each fragment starts in its document (int64).
        stops: tokens up to the end of each fragment (the cumulative lengths, int64).
        source: a packed mixture's: each fragment's source (int16); else ``None``.
    """

    values: np.ndarray
    begin: np.ndarray
    end: np.ndarray
    document: np.ndarray
    position: np.ndarray
    stops: np.ndarray
    source: np.ndarray | None = None

    @classmethod
    def of(  # noqa: PLR0917 (the fields, in order)
        cls,
        values: np.ndarray,
        begin: np.ndarray,
        end: np.ndarray,
        document: np.ndarray,
        position: np.ndarray,
        source: np.ndarray | None = None,
    ) -> Fragments:
        """Fragments over ``values`` (empty ones dropped)."""
        kept = end > begin
        if not kept.all():
            begin, end, document, position = begin[kept], end[kept], document[kept], position[kept]
            source = None if source is None else source[kept]
        return cls(values, begin, end, document, position, np.cumsum(end - begin), source)

    @classmethod
    def from_lists(
        cls,
        tokens: pa.Array,
        first_document: int,
        eos: int | None = None,
        source: int | None = None,
    ) -> Fragments:
        """The documents of ``tokens`` (a list array, one document a row) whole: row ``i`` is
        document ``first_document + i`` (of ``source``, a mixture's), followed by ``eos`` when
        given. A null list is an empty document (and takes no ``eos``); a null token inside
        one is 0."""
        if isinstance(tokens, pa.ChunkedArray):
            tokens = tokens.combine_chunks()
        # (Through the Arrow buffers: pyarrow's numpy conversions load pandas, `arrow_values`.)
        offsets = numpy_view(tokens.offsets).astype(np.int64)[: len(tokens) + 1]
        values = filled_values(tokens.flatten())  # (a sliced array's rows' values only)
        lengths = np.diff(offsets)
        present = valid_view(tokens)
        if tokens.null_count:
            lengths = np.where(present, lengths, 0)
        if eos is not None:
            values, lengths = _with_eos(values, lengths, present, eos)
        end = np.cumsum(lengths)
        documents = np.arange(first_document, first_document + len(tokens), dtype=np.int64)
        sources = None if source is None else np.full(len(tokens), source, np.int16)
        starts = np.zeros(len(tokens), np.int64)
        return cls.of(values, end - lengths, end, documents, starts, sources)

    @classmethod
    def concat(cls, fragments: Sequence[Fragments]) -> Fragments:
        """``fragments`` one after the other, over one new buffer; a document's fragments that
        meet (one ending where the next goes on) become one."""
        if len(fragments) == 1:
            return fragments[0]
        values = np.concatenate([f.tokens() for f in fragments])
        lengths = np.concatenate([f.end - f.begin for f in fragments])
        document = np.concatenate([f.document for f in fragments])
        position = np.concatenate([f.position for f in fragments])
        source = None
        if fragments[0].source is not None:
            source = np.concatenate([f.source for f in fragments if f.source is not None])
        end = np.cumsum(lengths)
        begin = end - lengths
        joined = goes_on(document, position, lengths, source)
        if joined.any():  # the same document going on: one fragment
            starts = np.flatnonzero(~joined)
            begin, document, position = begin[starts], document[starts], position[starts]
            source = None if source is None else source[starts]
            end = np.r_[begin[1:], end[-1]]
        return cls.of(values, begin, end, document, position, source)

    @property
    def num_rows(self) -> int:
        """Tokens of the fragments."""
        return int(self.stops[-1]) if len(self.stops) else 0

    def __len__(self) -> int:
        return self.num_rows

    def slice(self, offset: int = 0, length: int | None = None) -> Fragments:
        """Tokens ``[offset, offset + length)`` (to the end when ``length`` is ``None``): the
        fragments over them, the first and last cut (a cut document goes on at its position)."""
        every = self.stops
        total = int(every[-1]) if len(every) else 0
        stop = total if length is None else min(total, offset + length)
        offset = min(max(offset, 0), total)
        if offset == 0 and stop == total:
            return self
        if stop <= offset:
            empty = np.zeros(0, np.int64)
            none = None if self.source is None else self.source[:0]
            return Fragments(self.values, empty, empty, empty, empty, empty, none)
        # (Methods and scalars, not numpy's functions: every batch runs this,
        # docs/adr/0020-measurements-behind-constants.md#packing.)
        i = int(every.searchsorted(offset, side="right"))
        j = int(every.searchsorted(stop, side="left")) + 1
        begin = self.begin[i:j].copy()
        end = self.end[i:j].copy()
        position = self.position[i:j].copy()
        cut_front = offset - (int(every[i]) - int(end[0]) + int(begin[0]))
        begin[0] += cut_front
        position[0] += cut_front
        end[-1] -= int(every[j - 1]) - stop
        stops = every[i:j] - offset
        stops[-1] = stop - offset
        source = None if self.source is None else self.source[i:j]
        return Fragments(self.values, begin, end, self.document[i:j], position, stops, source)

    def permuted(self, order: np.ndarray) -> Fragments:
        """The fragments in ``order`` (indices of fragments)."""
        lengths = (self.end - self.begin)[order]
        return Fragments(
            self.values,
            self.begin[order],
            self.end[order],
            self.document[order],
            self.position[order],
            np.cumsum(lengths),
            None if self.source is None else self.source[order],
        )

    def in_values_order(self) -> Fragments:
        """The fragments ordered by where they sit in ``values`` (undoing a permutation)."""
        return self.permuted(np.argsort(self.begin, kind="stable"))

    def tokens(self, out: np.ndarray | None = None) -> np.ndarray:
        """The tokens in order (into ``out`` when given: ``num_rows`` long)."""
        n = self.num_rows
        if out is None:
            if n and int(self.end[-1] - self.begin[0]) == n and _contiguous(self):
                return self.values[int(self.begin[0]) : int(self.end[-1])]
            out = np.empty(n, self.values.dtype)
        count = len(self.begin)
        if count * TOKENS_PER_COPY < n:  # long fragments: one copy each
            values = self.values
            ranges = [
                values[b:e] for b, e in zip(self.begin.tolist(), self.end.tolist(), strict=True)
            ]
            np.concatenate(ranges, out=out)
        elif n:  # many short ones: one gather
            lengths = self.end - self.begin
            index = np.repeat(self.begin - (self.stops - lengths), lengths)
            index += np.arange(n)
            np.take(self.values, index, out=out)
        return out


# Fragments at least this long on average are copied one by one rather than gathered through an
# index (a Python step per fragment against an index of every token).
TOKENS_PER_COPY = 64


def goes_on(
    document: np.ndarray, position: np.ndarray, lengths: np.ndarray, source: np.ndarray | None
) -> np.ndarray:
    """Whether each fragment goes on with the one before (the same document of the same source,
    its positions continued); the first never does."""
    out = np.zeros(len(document), bool)
    np.equal(document[1:], document[:-1], out=out[1:])
    if not out.any():  # (the usual batch: whole documents, or fragments of different ones)
        return out
    out[1:] &= position[1:] == position[:-1] + lengths[:-1]
    if source is not None:
        out[1:] &= source[1:] == source[:-1]
    return out


def _contiguous(fragments: Fragments) -> bool:
    return bool(np.array_equal(fragments.begin[1:], fragments.end[:-1]))


def _with_eos(
    values: np.ndarray, lengths: np.ndarray, present: np.ndarray, eos: int
) -> tuple[np.ndarray, np.ndarray]:
    """``values`` with ``eos`` after each present document, and the documents' new lengths."""
    longer = lengths + present
    ends = np.cumsum(longer)
    out = np.empty(int(ends[-1]) if len(ends) else 0, dtype=values.dtype)
    separator = np.zeros(len(out), bool)
    separator[(ends - 1)[present]] = True
    out[~separator] = values
    out[separator] = eos
    return out, longer
