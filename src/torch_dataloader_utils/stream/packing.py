"""Packed sequences: the epoch as a token order.

The design (docs/adr/0022-packed-sequences.md): a packed dataset plans each chunk's token
count, and the existing streams cut the epoch's token sequence exactly as they cut rows, with a
batch of ``batch_size * seq_len`` tokens (best fit: ``fill`` of them). A worker reads its
chunks' documents as `Fragments` (`stream.tokens.TokenReader`), a block moves by whole documents
(`planning.shuffle.document_permutation`), and each batch of tokens becomes ``batch_size``
sequences of ``seq_len`` (`pack`, or `pack_best_fit`; `PackedConverter`). Every token is read
once because every row of the token order is, and every rank has the same batches because the
streams are cut in tokens.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from ..convert import Planned, copied, each_written
from . import pack_kernel
from .best_fit import place, sequences_for
from .fragments import TOKENS_PER_COPY, Fragments, goes_on

__all__ = ["Packed", "PackedConverter", "pack", "pack_best_fit"]


@dataclass(frozen=True)
class Packed:
    """A batch of packed sequences.

    Attributes:
        input_ids: ``[batch, seq_len]`` tokens (concat: the last sequence of a stream padded;
            best fit: each sequence's end).
        position_ids: int32: each token's place in its fragment (``positions="fragment"``), or
            in its document (``"document"``: continued across sequences); padding counts from 0
            in each sequence, as a fragment of its own.
        document_ids: int32: each token's document (best fit: its fragment of the batch, a
            document's tokens in the batch), numbered from 0 in the batch (-1: padding).
        cu_seqlens: int32 ``[k + 1]``: where each document fragment starts in the flattened
            batch, a fragment also starting at every sequence start; then the total.
        max_seqlen: the longest fragment.
        padding: padded tokens in the batch.
        source_ids: a packed mixture's: int32, each token's source (-1: padding).
    """

    input_ids: np.ndarray
    position_ids: np.ndarray
    document_ids: np.ndarray
    cu_seqlens: np.ndarray
    max_seqlen: int
    padding: int
    source_ids: np.ndarray | None = None


def pack(
    fragments: Fragments,
    seq_len: int,
    *,
    pad_value: int = 0,
    positions: str = "fragment",
    rows: int | None = None,
) -> Packed:
    """The tokens of ``fragments`` as sequences of ``seq_len``, the last one padded with
    ``pad_value`` (its own fragment in ``cu_seqlens``); with ``rows``, that many sequences
    (a static shape: whole sequences of padding after the tokens, a fragment each). Boundaries
    come from the fragments (the list offsets), never from a token's value; ``positions``
    as `batching.Packing` says."""
    n = fragments.num_rows
    size = _size(n, seq_len, rows)
    made = pack_kernel.concat(
        fragments, seq_len, size, pad_value=pad_value, by_fragment=positions == "fragment"
    )
    if made is not None:  # (one compiled pass, where numba is loaded: the same arrays)
        ids, position_ids, documents = made.input_ids, made.position_ids, made.document_ids
        cuts = made.cu_seqlens, made.max_seqlen
        return _packed(seq_len, ids, position_ids, documents, cuts, made.source_ids, n)
    concat = _Concat(fragments, seq_len, pad_value, positions=positions, rows=rows)
    arrays = []
    for dtype, write in concat.writers(sources=True):
        arrays.append(np.empty(size, dtype))
        write(arrays[-1])
    ids, position_ids, documents, *sources = arrays
    source_ids = next(iter(sources), None)
    cuts = concat.cu_seqlens, concat.max_seqlen
    return _packed(seq_len, ids, position_ids, documents, cuts, source_ids, n)


class _Concat:
    """How a batch of tokens (``fragments``) lies in sequences of ``seq_len``, one after the
    other (`pack` where the compiled pass is not loaded): worked out from the fragments (a few
    numbers each); its arrays are written by `writers`, each where it goes (a worker's
    transport buffer)."""

    def __init__(
        self,
        fragments: Fragments,
        seq_len: int,
        pad_value: int,
        *,
        positions: str = "fragment",
        rows: int | None = None,
    ) -> None:
        self.fragments = fragments
        self.pad_value = pad_value
        self.by_fragment = positions == "fragment"
        self.n = n = fragments.num_rows
        self.size = size = _size(n, seq_len, rows)
        self.lengths = lengths = fragments.end - fragments.begin
        starts = fragments.stops - lengths
        # A token's position: its place in the batch less this (its fragment's shift).
        self.shift = (starts - fragments.position).astype(np.int32)
        # A document's fragments that meet are one (a cut between blocks): rare, so the
        # usual batch takes a path of fewer steps
        # (docs/adr/0020-measurements-behind-constants.md#packing).
        joined = goes_on(fragments.document, fragments.position, lengths, fragments.source)
        if joined.any():
            self.document = np.cumsum(~joined, dtype=np.int32) - 1
            starts = starts[~joined]
        else:
            self.document = np.arange(len(lengths), dtype=np.int32)
        # Fragments start at each document and at each sequence; the padding of each sequence
        # is one more.
        self.cu_seqlens = _distinct(starts, np.arange(0, size, seq_len), [n, size])
        self.max_seqlen = _longest(self.cu_seqlens)

    def writers(self, sources: bool) -> list[tuple[np.dtype[Any], Callable[[np.ndarray], None]]]:
        """The dtype and writer of ``input_ids``, ``position_ids``, ``document_ids`` and, with
        ``sources`` (a mixture's), ``source_ids``; a writer takes an array of ``size`` values
        (any shape)."""
        sources = sources and self.fragments.source is not None
        out: list[tuple[np.dtype[Any], Callable[[np.ndarray], None]]] = [
            (_wide(self.fragments.dtype), self._ids),
            (np.dtype(np.int32), self._positions),
            (np.dtype(np.int32), self._documents),
        ]
        if sources:
            out.append((np.dtype(np.int32), self._sources))
        return out

    def _ids(self, out: np.ndarray) -> None:
        flat, n = out.reshape(-1), self.n
        if flat.dtype == self.fragments.dtype:
            self.fragments.tokens(flat[:n])  # gathered straight into the sequences
        else:
            flat[:n] = self.fragments.tokens()
        flat[n:] = self.pad_value

    def _positions(self, out: np.ndarray) -> None:
        flat, n = out.reshape(-1), self.n
        if self.by_fragment:  # every fragment, padding included, counts from 0
            _fragment_positions(self.cu_seqlens, flat)
            return
        np.subtract(_counting(n), np.repeat(self.shift, self.lengths), out=flat[:n])
        cuts = self.cu_seqlens
        _fragment_positions(cuts[cuts >= n] - n, flat[n:])

    def _documents(self, out: np.ndarray) -> None:
        flat, n = out.reshape(-1), self.n
        flat[:n] = np.repeat(self.document, self.lengths)
        flat[n:] = -1

    def _sources(self, out: np.ndarray) -> None:
        flat, n = out.reshape(-1), self.n
        assert self.fragments.source is not None, "only a mixture's tokens have sources"
        flat[:n] = np.repeat(self.fragments.source, self.lengths)
        flat[n:] = -1


def pack_best_fit(
    fragments: Fragments,
    seq_len: int,
    batch_size: int,
    *,
    budget: int,
    pad_value: int = 0,
    positions: str = "fragment",
    static_shape: bool = False,
) -> Packed:
    """The tokens of ``fragments`` (a batch of at most ``budget`` tokens) as ``batch_size``
    sequences of ``seq_len`` arranged by best fit (`best_fit.place`): each of the batch's
    fragments (a document's tokens in the batch) whole in one sequence where one has room,
    padding at each sequence's end (its own fragment in ``cu_seqlens``). A short batch (a
    stream's last) takes the sequences it fills, at most `best_fit.sequences_for` (with
    ``static_shape``, ``batch_size`` all the same, the rest padding). ``document_ids`` number
    the batch's fragments in batch order; ``positions`` as `batching.Packing` says."""
    n = fragments.num_rows
    over, begin, lengths, position, source = _batch_fragments(fragments)
    rows = batch_size if n >= budget else sequences_for(n, batch_size, budget)
    where = place(lengths.tolist(), seq_len, rows)
    if n < budget:  # (the used sequences are the first ones)
        rows = int(np.count_nonzero(where.filled))
    if static_shape:
        rows = batch_size
    filled = np.zeros(rows, np.int64)
    used = min(rows, len(where.filled))
    filled[:used] = where.filled[:used]
    size = rows * seq_len
    src = begin[where.item] + where.offset
    # A placed fragment's first position: 0 (each counts from 0), or where it is in its document.
    starts = position[where.item] + where.offset if positions == "document" else None
    ids = np.empty(size, _wide(over.dtype))
    position_ids = np.empty(size, np.int32)
    document_ids = np.empty(size, np.int32)
    if len(src) * TOKENS_PER_COPY <= n:  # long fragments: a copy each, then each padding
        count = np.arange(seq_len, dtype=np.int32)
        firsts = [0] * len(src) if starts is None else starts.tolist()
        which = over.bases.searchsorted(src, side="right") - 1  # (each in one buffer)
        for at, b, length, p, i, k in zip(
            where.start.tolist(),
            (src - over.bases[which]).tolist(),
            where.length.tolist(),
            firsts,
            where.item.tolist(),
            which.tolist(),
            strict=True,
        ):
            ids[at : at + length] = over.buffers[k][b : b + length]
            position_ids[at : at + length] = count[:length]
            if p:  # (most are whole documents; an add costs a microsecond)
                position_ids[at : at + length] += p
            document_ids[at : at + length] = i
        for j, used in enumerate(filled.tolist()):
            pad = slice(j * seq_len + used, (j + 1) * seq_len)
            ids[pad], position_ids[pad], document_ids[pad] = pad_value, count[: seq_len - used], -1
    else:  # many short fragments: gathers, and every sequence's head of real tokens at once
        ids[:], document_ids[:] = pad_value, -1
        real = (np.arange(seq_len) < filled[:, None]).reshape(-1)
        placed = Fragments.of(over.buffers, src, src + where.length, where.item, where.offset)
        ids[real] = placed.tokens(np.empty(n, over.dtype))
        document_ids[real] = np.repeat(where.item, where.length)
    # Fragments start at each placed one, each sequence and each sequence's padding.
    sequences = np.arange(rows, dtype=np.int64) * seq_len
    cu_seqlens = _distinct(where.start, sequences, sequences + filled, [size])
    if len(src) * TOKENS_PER_COPY > n:  # (the loop above wrote the positions)
        _fragment_positions(cu_seqlens, position_ids)
        if starts is not None:  # a document's: its placed fragment's first position added
            position_ids[real] += np.repeat(starts, where.length)
    sources = None
    if source is not None:  # a packed mixture's: each token's source, its batch fragment's
        sources = np.full(size, -1, np.int32)
        # The real tokens are each sequence's head, filled by the placed fragments in the order
        # they start.
        real = (np.arange(seq_len) < filled[:, None]).reshape(-1)
        order = np.argsort(where.start, kind="stable")
        sources[real] = np.repeat(source[where.item][order], where.length[order])
    cuts = cu_seqlens, _longest(cu_seqlens)
    return _packed(seq_len, ids, position_ids, document_ids, cuts, sources, n)


def _packed(  # noqa: PLR0917 (the batch's arrays, in `Packed`'s order)
    seq_len: int,
    ids: np.ndarray,
    positions: np.ndarray,
    documents: np.ndarray,
    cuts: tuple[np.ndarray, int],
    sources: np.ndarray | None,
    tokens: int,
) -> Packed:
    """The batch's flat arrays as sequences of ``seq_len`` (``tokens`` of them real), with
    their ``cu_seqlens`` and ``max_seqlen`` (``cuts``)."""
    shape = (-1, seq_len)
    return Packed(
        ids.reshape(shape),
        positions.reshape(shape),
        documents.reshape(shape),
        *cuts,
        len(ids) - tokens,
        None if sources is None else sources.reshape(shape),
    )


def _batch_fragments(
    fragments: Fragments,
) -> tuple[Fragments, np.ndarray, np.ndarray, np.ndarray, np.ndarray | None]:
    """The batch's fragments (a document's tokens in the batch): fragments whose buffers
    hold their tokens, each of them in one buffer, and the begin, length, position and source
    (a mixture's) of each; a document's fragments that go on one from the other are joined,
    over the batch's tokens laid out in order then (as are fragments that run from one
    buffer into the next)."""
    lengths = fragments.end - fragments.begin
    joined = goes_on(fragments.document, fragments.position, lengths, fragments.source)
    if not joined.any() and fragments.each_in_one_buffer():
        return fragments, fragments.begin, lengths, fragments.position, fragments.source
    first = ~joined
    begin = (fragments.stops - lengths)[first]
    source = None if fragments.source is None else fragments.source[first]
    lengths = np.diff(np.r_[begin, fragments.num_rows])
    laid = Fragments.of(fragments.tokens(), *[begin[:0]] * 4)  # (its buffer alone)
    return laid, begin, lengths, fragments.position[first], source


def _longest(cu_seqlens: np.ndarray) -> int:
    """The longest fragment of ``cu_seqlens``."""
    return int((cu_seqlens[1:] - cu_seqlens[:-1]).max()) if len(cu_seqlens) > 1 else 0


def _distinct(*cuts: np.ndarray | list[int]) -> np.ndarray:
    """The distinct numbers of ``cuts`` in order, as int32 (a batch's ``cu_seqlens``: a few
    dozen numbers; `np.r_` and `np.unique` cost more than the work)."""
    out = np.concatenate(cuts)
    out.sort()
    keep = np.empty(len(out), bool)
    keep[:1] = True
    np.not_equal(out[1:], out[:-1], out=keep[1:])
    return out[keep].astype(np.int32)


def _counting(n: int) -> np.ndarray:
    """``0, 1, ..., n - 1`` as int32 (a view of one array kept for every batch)."""
    global _COUNTING
    if len(_COUNTING) < n:
        _COUNTING = np.arange(max(n, 2 * len(_COUNTING)), dtype=np.int32)
    return _COUNTING[:n]


_COUNTING = np.arange(0, dtype=np.int32)


def _size(tokens: int, seq_len: int, rows: int | None) -> int:
    """A batch's slots: its tokens' sequences, or ``rows`` of them (a static shape)."""
    size = (-(-tokens // seq_len) if rows is None else rows) * seq_len
    assert tokens <= size, "more tokens than the sequences hold"
    return size


def _fragment_positions(cu_seqlens: np.ndarray, out: np.ndarray) -> None:
    """Each token's place in its fragment of ``cu_seqlens`` (which span ``out``), into
    ``out``: the positions no attention implementation misreads (docs/adr/0026)."""
    np.subtract(_counting(len(out)), np.repeat(cu_seqlens[:-1], np.diff(cu_seqlens)), out=out)


def _wide(dtype: np.dtype[Any]) -> np.dtype[Any]:
    """A token dtype torch handles fully: unsigned ids of 16 bits and more widened."""
    if dtype.kind == "u" and dtype.itemsize >= 2:
        return np.dtype(np.int32 if dtype.itemsize == 2 else np.int64)
    return dtype


@dataclass(frozen=True)
class PackedConverter:
    """A packed dataset's conversion: a batch of tokens (`Fragments`) as ``batch_size``
    sequences (`pack`, or `pack_best_fit` for ``method="best_fit"``, whose batches are
    ``batch_tokens`` tokens), as torch tensors or numpy arrays; what
    `transport.worker_messages` takes where other datasets have a `convert.Converter`."""

    seq_len: int
    pad_value: int
    output_format: str = "torch"
    list_format: str = "padded"  # (nothing nested to finish in the main process)
    source_key: str | None = None  # a mixture's ``source_column``: each token's source
    method: str = "concat"
    positions: str = "fragment"
    static_shape: bool = False
    batch_size: int = 1
    batch_tokens: int = 1

    def __post_init__(self) -> None:
        if self.method == "concat":  # (now, where the dataset is made: forked workers have it)
            pack_kernel.load()

    def planned(self, batch: Fragments) -> Planned:
        """The packed batch as a worker sends it (`transport.wire.pack_planned`), ``max_seqlen``
        a Python int: concat's arrays written where they go by the compiled pass (the
        boundaries too, in room for `pack_kernel.most_cuts`: the pass settles how many), or by
        numpy's writers; best fit's copied there."""
        names = ("input_ids", "position_ids", "document_ids", self.source_key)
        keys = [k for k in names if k is not None]  # (sources: where a column asks for them)
        if self.method == "concat" and pack_kernel.takes(batch):
            rows = self.batch_size if self.static_shape else None
            size = _size(batch.num_rows, self.seq_len, rows)
            by_fragment = self.positions == "fragment"
            return pack_kernel.planned(batch, keys, self.seq_len, size, self.pad_value, by_fragment)
        if self.method == "best_fit":
            packed = self._best_fit(batch)
            arrays = [packed.input_ids, packed.position_ids, packed.document_ids, packed.source_ids]
            cu_seqlens, max_seqlen = packed.cu_seqlens, packed.max_seqlen
            sent = [(k, a) for k, a in zip(keys, arrays, strict=False) if a is not None]
            layout: list[tuple[str, Any, Any]] = [(k, a.dtype, a.shape) for k, a in sent]
            writers: list[Callable[[np.ndarray], None]] = [copied(a) for _, a in sent]
        else:
            concat = self._concat(batch)
            shape = (concat.size // self.seq_len, self.seq_len)
            cu_seqlens, max_seqlen = concat.cu_seqlens, concat.max_seqlen
            made = concat.writers(len(keys) > 3)
            layout = [(k, dtype, shape) for k, (dtype, _) in zip(keys, made, strict=False)]
            writers = [write for _, write in made]
        layout[3:3] = [
            ("cu_seqlens", cu_seqlens.dtype, cu_seqlens.shape),
            ("max_seqlen", None, max_seqlen),
        ]
        writers.insert(3, copied(cu_seqlens))
        return Planned(layout, each_written(writers))

    def __call__(self, batch: Fragments, rows: None = None) -> dict[str, Any]:
        """The packed batch, as tensors (``output_format="torch"``) or numpy arrays."""
        assert rows is None, "a packed stream's batches are whole"
        if self.method == "best_fit":
            packed = self._best_fit(batch)
        else:
            packed = pack(
                batch,
                self.seq_len,
                pad_value=self.pad_value,
                positions=self.positions,
                rows=self.batch_size if self.static_shape else None,
            )
        # (Every array is the batch's own: tensors straight from them, no `Field` steps.)
        make = torch.from_numpy if self.output_format == "torch" else np.asarray
        out: dict[str, Any] = {
            "input_ids": make(packed.input_ids),
            "position_ids": make(packed.position_ids),
            "document_ids": make(packed.document_ids),
            "cu_seqlens": make(packed.cu_seqlens),
            "max_seqlen": packed.max_seqlen,
        }
        if self.source_key is not None and packed.source_ids is not None:
            out[self.source_key] = make(packed.source_ids)
        return out

    def _concat(self, batch: Fragments) -> _Concat:
        rows = self.batch_size if self.static_shape else None
        return _Concat(batch, self.seq_len, self.pad_value, positions=self.positions, rows=rows)

    def _best_fit(self, batch: Fragments) -> Packed:
        return pack_best_fit(
            batch,
            self.seq_len,
            self.batch_size,
            budget=self.batch_tokens,
            pad_value=self.pad_value,
            positions=self.positions,
            static_shape=self.static_shape,
        )

    def finish_torch(self, batch: dict[str, Any]) -> dict[str, Any]:
        """Nothing to finish in the main process."""
        return batch
