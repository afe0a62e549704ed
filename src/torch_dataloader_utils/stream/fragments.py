"""A packed stream's rows as fragments of documents (`Fragments`): its rows are tokens, but a
worker never lays them out one by one.

A packed dataset's order is one of tokens (docs/adr/0022-packed-sequences.md). The pipeline
groups, shuffles and cuts a stream's rows by position (`stream.blocks`, `stream.batches`); for a
packed stream those rows are held as fragments of documents over the buffers of token values
they were decoded into, so that slicing a token range and shuffling a block by whole documents
cost a few operations per document, not per token. Tokens are copied once, into the sequences
(`Fragments.tokens`, or the compiled packing pass): a block's decoded parts stay in their own
buffers (docs/adr/0037-fragments-over-decoded-buffers.md).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from ..convert.arrow_values import filled_values, numpy_view, valid_view

__all__ = ["MAX_BUFFERS", "TOKENS_PER_COPY", "Fragments", "goes_on"]


_ONE_BUFFER = np.zeros(1, np.int64)
_ONE_BUFFER.flags.writeable = False


# (Not frozen: a batch makes several, and a frozen dataclass's fields cost 2 µs to set.)
@dataclass(eq=False, slots=True)
class Fragments:
    """Fragments of documents (a document's tokens within one block, batch or sequence), in
    order; their tokens are the rows (``num_rows``). Treated as immutable.

    Attributes:
        buffers: the token values, one buffer or a few laid end to end (a block's decoded
            parts, at most `MAX_BUFFERS`); the fragments are ranges of that concatenation.
        bases: where each buffer starts in the concatenation (int64, one per buffer).
        begin, end: each fragment's tokens, ``[begin, end)`` of the buffers end to end (int64;
            a fragment may run from one buffer into the next).
        document: each fragment's document, a number unique in the epoch (int64).
        position: where each fragment starts in its document (int64).
        stops: tokens up to the end of each fragment (the cumulative lengths, int64).
        source: a packed mixture's: each fragment's source (int16); else ``None``.
    """

    buffers: tuple[np.ndarray, ...]
    bases: np.ndarray
    begin: np.ndarray
    end: np.ndarray
    document: np.ndarray
    position: np.ndarray
    stops: np.ndarray
    source: np.ndarray | None = None

    @classmethod
    def of(  # noqa: PLR0917 (the fields, in order)
        cls,
        values: np.ndarray | tuple[np.ndarray, ...],
        begin: np.ndarray,
        end: np.ndarray,
        document: np.ndarray,
        position: np.ndarray,
        source: np.ndarray | None = None,
    ) -> Fragments:
        """Fragments over ``values`` (one buffer, or several end to end: more than
        `MAX_BUFFERS` are copied into one; empty fragments dropped)."""
        kept = end > begin
        if not kept.all():
            begin, end, document, position = begin[kept], end[kept], document[kept], position[kept]
            source = None if source is None else source[kept]
        buffers = values if isinstance(values, tuple) else (values,)
        if len(buffers) > MAX_BUFFERS:
            buffers = (np.concatenate(buffers),)
        stops = np.cumsum(end - begin)
        return cls(buffers, _bases(buffers), begin, end, document, position, stops, source)

    @property
    def dtype(self) -> np.dtype:
        """The tokens' dtype."""
        return self.buffers[0].dtype

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
        """``fragments`` one after the other; a document's fragments that meet (one ending
        where the next goes on) become one. Each one's tokens stay where they are when they lie
        in order in one buffer (a decoded part's): up to `MAX_BUFFERS` buffers are kept, more
        are copied into one."""
        if len(fragments) == 1:
            return fragments[0]
        parts = [f.tokens() for f in fragments]
        buffers = tuple(p for p in parts if len(p)) or (parts[0],)
        lengths = np.concatenate([f.end - f.begin for f in fragments])
        document = np.concatenate([f.document for f in fragments])
        position = np.concatenate([f.position for f in fragments])
        source = None
        if fragments[0].source is not None:
            source = np.concatenate([f.source for f in fragments if f.source is not None])
        end = np.cumsum(lengths)
        begin = end - lengths
        joined = goes_on(document, position, lengths, source)
        if joined.any():  # the same document going on: one fragment (across buffers, maybe)
            starts = np.flatnonzero(~joined)
            begin, document, position = begin[starts], document[starts], position[starts]
            source = None if source is None else source[starts]
            end = np.r_[begin[1:], end[-1]]
        return cls.of(buffers, begin, end, document, position, source)

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
            return Fragments(self.buffers, self.bases, empty, empty, empty, empty, empty, none)
        # (Methods and scalars, not numpy's functions: every batch runs this,
        # docs/adr/0020-measurements-behind-constants.md#packing; the two searches in one.)
        i, j = every.searchsorted((offset, stop - 1), side="right").tolist()
        j += 1
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
        document = self.document[i:j]
        return Fragments(self.buffers, self.bases, begin, end, document, position, stops, source)

    def permuted(self, order: np.ndarray) -> Fragments:
        """The fragments in ``order`` (indices of fragments)."""
        lengths = (self.end - self.begin)[order]
        return Fragments(
            self.buffers,
            self.bases,
            self.begin[order],
            self.end[order],
            self.document[order],
            self.position[order],
            np.cumsum(lengths),
            None if self.source is None else self.source[order],
        )

    def in_values_order(self) -> Fragments:
        """The fragments ordered by where they sit in the buffers (undoing a permutation)."""
        return self.permuted(np.argsort(self.begin, kind="stable"))

    def tokens(self, out: np.ndarray | None = None) -> np.ndarray:
        """The tokens in order (into ``out`` when given: ``num_rows`` long); a view where they
        lie in order in one buffer and no ``out`` is given."""
        n = self.num_rows
        if out is None:
            if n and int(self.end[-1] - self.begin[0]) == n and _contiguous(self):
                first, last = int(self.begin[0]), int(self.end[-1])
                k = int(self.bases.searchsorted(first, side="right")) - 1
                if last - int(self.bases[k]) <= len(self.buffers[k]):
                    return self.buffers[k][first - int(self.bases[k]) : last - int(self.bases[k])]
            out = np.empty(n, self.dtype)
        count = len(self.begin)
        if count * TOKENS_PER_COPY < n:  # long fragments: one copy each
            np.concatenate(self._ranges(), out=out)
        elif n:  # many short ones: one gather (from each buffer)
            lengths = self.end - self.begin
            index = np.repeat(self.begin - (self.stops - lengths), lengths)
            index += np.arange(n)
            if len(self.buffers) == 1:
                np.take(self.buffers[0], index, out=out)
            else:
                where = self.bases.searchsorted(index, side="right") - 1
                for k, buffer in enumerate(self.buffers):
                    mine = where == k
                    out[mine] = buffer[index[mine] - self.bases[k]]
        return out

    def each_in_one_buffer(self) -> bool:
        """Whether no fragment runs from one buffer into the next (a document cut between
        two decoded parts and joined does)."""
        if len(self.buffers) == 1:
            return True
        limits = self.bases + np.array([len(b) for b in self.buffers])
        which = self.bases.searchsorted(self.begin, side="right") - 1
        return bool((self.end <= limits[which]).all())

    def _ranges(self) -> list[np.ndarray]:
        """Each fragment's tokens, a view of the buffer that holds them (of each, for one that
        runs from one buffer into the next)."""
        if len(self.buffers) == 1:
            values = self.buffers[0]
            return [
                values[b:e] for b, e in zip(self.begin.tolist(), self.end.tolist(), strict=True)
            ]
        which = self.bases.searchsorted(self.begin, side="right") - 1
        base = self.bases[which]
        out = []
        for k, b, e in zip(
            which.tolist(), (self.begin - base).tolist(), (self.end - base).tolist(), strict=True
        ):
            buffer = self.buffers[k]
            if e <= len(buffer):
                out.append(buffer[b:e])
            else:  # (rare: a document cut between two decoded parts, joined)
                out += self._range(b + int(self.bases[k]), e + int(self.bases[k]))
        return out

    def _range(self, begin: int, end: int) -> list[np.ndarray]:
        """Tokens ``[begin, end)`` of the buffers end to end, as a view of each that holds
        some."""
        out = []
        k = int(self.bases.searchsorted(begin, side="right")) - 1
        while begin < end:
            base = int(self.bases[k])
            stop = min(end, base + len(self.buffers[k]))
            if stop > begin:
                out.append(self.buffers[k][begin - base : stop - base])
                begin = stop
            k += 1
        return out


# A block's decoded parts kept as buffers of their own, at most (more are copied into one): the
# compiled packing pass takes this many (docs/adr/0037-fragments-over-decoded-buffers.md).
MAX_BUFFERS = 8

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


def _bases(buffers: tuple[np.ndarray, ...]) -> np.ndarray:
    """Where each of ``buffers`` starts when they are laid end to end."""
    if len(buffers) == 1:
        return _ONE_BUFFER
    out = np.zeros(len(buffers), np.int64)
    np.cumsum([len(b) for b in buffers[:-1]], out=out[1:])
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
