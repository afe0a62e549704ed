"""Every random permutation of the library, and the blocks rows are shuffled in (pure).

Each permutation is a function of its key alone: the seed and the numbers that say which
permutation it is (epoch, stream, block, ...). A named salt keeps the keys of different kinds of
permutation apart, so that no two draw the same random numbers:

- `chunk_order`: the order an epoch concatenates one source's chunks in (`CHUNK_ORDER`);
- `source_order`: a mixture's source's chunk order in one of its passes (`CHUNK_ORDER`,
  `SOURCE`);
- `window_order`: the positions of one window of a random interleave (`INTERLEAVE`);
- `block_permutation`: the rows of one shuffle block of a stream (`SOURCE` for a mixture's
  source's rows of a stream);
- `document_permutation`: a packed stream's block, by whole documents (`DOCUMENTS`).

The last two are drawn through `BlockOrder`, the order a stream delivers a source's rows in:
reading (`stream.blocks`), resuming (`resume`, `budget`, `mixture_legs`) and looking up a batch
(`dataset.lookup`) all ask it, so that they cannot disagree on a key.

The values are part of every saved state's meaning: changing one changes every shuffled order.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

# numpy loads its random module at its first use, 14 ms: here that is the first epoch's first
# batch (docs/benchmarks.md#first-batch), so it is loaded with the library instead.
import numpy.random

from ..errors import InvalidArgumentError
from .layout import Layout

__all__ = [
    "BlockOrder",
    "block_bounds",
    "block_of",
    "block_permutation",
    "chunk_order",
    "document_permutation",
    "source_order",
    "window_order",
]

# The salts (see the module docstring).
CHUNK_ORDER = 0x0C
SOURCE = 0x5C
INTERLEAVE = 0x313
DOCUMENTS = 0xD0C


def chunk_order(num_chunks: int, *, seed: int, epoch: int, shuffle: bool) -> np.ndarray:
    """The order chunks are concatenated in for ``epoch``: a permutation by ``(seed, epoch)``."""
    if not shuffle:
        return np.arange(num_chunks)
    return np.random.default_rng([seed, epoch, CHUNK_ORDER]).permutation(num_chunks)


def source_order(
    num_chunks: int, *, seed: int, source: int, passes: int, shuffle: bool
) -> np.ndarray:
    """The chunk order of pass ``passes`` over a mixture's source ``source``."""
    if not shuffle:
        return np.arange(num_chunks)
    key = [seed, passes, CHUNK_ORDER, SOURCE, source]
    return np.random.default_rng(key).permutation(num_chunks)


def window_order(
    n: int, *, seed: int, epoch: int, leg: int, window: int, phase: int = 0
) -> np.ndarray:
    """The order of the ``n`` positions of window ``window`` of a random interleave (of a
    weights schedule's ``phase``)."""
    key = [seed, epoch, leg, window, INTERLEAVE, *([phase] if phase else [])]
    return np.random.default_rng(key).permutation(n)


def block_bounds(length: int, *, block_rows: int, first_block_rows: int) -> list[tuple[int, int]]:
    """Split ``length`` stream rows into blocks shuffled together.

    Blocks ramp up from ``first_block_rows``, doubling, to ``block_rows``, so the first batch
    comes after a small read while later blocks mix widely.
    """
    if block_rows < 1:
        raise InvalidArgumentError(f"block_rows must be >= 1, got {block_rows}")
    bounds: list[tuple[int, int]] = []
    size = max(1, min(first_block_rows, block_rows))
    pos = 0
    while pos < length:
        stop = min(pos + size, length)
        bounds.append((pos, stop))
        pos = stop
        size = min(size * 2, block_rows)
    return bounds


def block_of(
    position: int, length: int, *, block_rows: int, first_block_rows: int
) -> tuple[int, int, int]:
    """The block of `block_bounds` that holds stream row ``position < length``: its index, first
    row and end, without listing the blocks (an elastic resume asks it for every old stream)."""
    size = max(1, min(first_block_rows, block_rows))
    pos = index = 0
    while size < block_rows:  # the ramp: a few blocks at most
        stop = min(pos + size, length)
        if position < stop:
            return index, pos, stop
        pos, index, size = stop, index + 1, min(size * 2, block_rows)
    k = (position - pos) // block_rows
    start = pos + k * block_rows
    return index + k, start, min(start + block_rows, length)


def block_permutation(
    *,
    seed: int,
    epoch: int,
    stream: int,
    block: int,
    n: int,
    leg: int = 0,
    source: int | None = None,
) -> np.ndarray:
    """The permutation of block ``block`` of ``stream`` in ``epoch``: a function of those alone.

    ``leg`` counts elastic resumes inside the epoch (the streams after one are new streams).
    ``source``: in a mixture, the source whose rows of the stream the block holds.
    """
    key = [seed, epoch, stream, block] if not leg else [seed, epoch, stream, block, leg]
    if source is not None:
        key += [leg, SOURCE, source]
    return np.random.default_rng(key).permutation(n)


def document_permutation(
    n: int,
    *,
    seed: int,
    epoch: int,
    stream: int,
    block: int,
    leg: int = 0,
    source: int | None = None,
) -> np.ndarray:
    """The order of the ``n`` documents (fragments of documents) of a packed stream's block:
    each moves whole, its tokens together and in order (`stream.fragments.Fragments`)."""
    key = [seed, epoch, stream, block, leg, DOCUMENTS]
    if source is not None:
        key += [SOURCE, source]
    return np.random.default_rng(key).permutation(n)


@dataclass(frozen=True, slots=True)
class BlockOrder:
    """The order a stream delivers one source's rows in: its ``length`` rows cut into blocks
    (`block_bounds` of ``layout``), each block's rows permuted under its own key, or all in
    order without shuffling. A packed stream's blocks move by whole documents (`documents`).

    Attributes:
        layout: the options that cut and shuffle the blocks (seed, sizes, shuffle, documents).
        length: the stream's rows (in a mixture, its rows of ``source``).
        epoch: the epoch.
        stream: the stream's number, ``rank * num_workers + worker``.
        leg: elastic resumes before the stream's leg of the epoch (a leg's streams are new).
        source: in a mixture, the source whose rows these are (``None``: one source).
    """

    layout: Layout
    length: int
    epoch: int
    stream: int
    leg: int = 0
    source: int | None = None

    def bounds(self) -> list[tuple[int, int]]:
        """Every block's first row and end, in order."""
        layout = self.layout
        return block_bounds(
            self.length, block_rows=layout.block_rows, first_block_rows=layout.first_block_rows
        )

    def block_of(self, position: int) -> tuple[int, int, int]:
        """The block that holds stream row ``position < length``: its index, first row, end."""
        layout = self.layout
        return block_of(
            position,
            self.length,
            block_rows=layout.block_rows,
            first_block_rows=layout.first_block_rows,
        )

    def permutation(self, block: int, n: int) -> np.ndarray:
        """The order of the ``n`` rows of block ``block``: offset ``k`` in it delivers its row
        ``permutation[k]``."""
        return block_permutation(
            seed=self.layout.seed,
            epoch=self.epoch,
            stream=self.stream,
            block=block,
            n=n,
            leg=self.leg,
            source=self.source,
        )

    def documents(self, block: int, n: int) -> np.ndarray:
        """The order of the ``n`` documents (fragments of documents) of a packed stream's block
        ``block``: each moves whole."""
        return document_permutation(
            n,
            seed=self.layout.seed,
            epoch=self.epoch,
            stream=self.stream,
            block=block,
            leg=self.leg,
            source=self.source,
        )

    def delivered(self, offsets: np.ndarray) -> np.ndarray:
        """The stream rows delivered ``offsets``-th (each below ``length``, counted in the order
        the stream delivers its rows): each through its block's permutation.

        Raises:
            TypeError: a packed stream's, whose order depends on its documents' lengths.
        """
        offsets = np.asarray(offsets, dtype=np.int64)
        if not self.layout.shuffle or not len(offsets):
            return offsets
        if self.layout.documents:
            raise TypeError("a packed stream's blocks move by documents: see `documents`")
        # Sorted offsets (a batch's, a whole stream's) go block by block as slices.
        at = None if bool(np.all(offsets[1:] >= offsets[:-1])) else np.argsort(offsets)
        ordered = offsets if at is None else offsets[at]
        out = np.empty_like(offsets)
        i = 0
        while i < len(ordered):  # one block at a time (a batch is in one or two)
            block, start, stop = self.block_of(int(ordered[i]))
            j = int(np.searchsorted(ordered, stop, side="left"))
            rows = start + self.permutation(block, stop - start)[ordered[i:j] - start]
            out[slice(i, j) if at is None else at[i:j]] = rows
            i = j
        return out
