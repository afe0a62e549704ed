"""A mixture's batches: rows taken in order from each source's blocks and placed at the
positions the interleave gives that source (`planning.mixture`, `planning.streams.Mixed`).

Each source's rows of a stream are read and shuffled in its own blocks, as one source's stream
is (`stream.pipeline`); this module only puts the batches together, position by position.

A batch whose rows lie in the sources' current shuffled blocks is gathered straight from them:
the blocks are joined once into one record batch (`_Joined`) and each batch is that batch and
the indices of its rows, gathered once on conversion like one source's batch. A source's block
nearly used up is joined with its next one, so that the sources' blocks, which end about
together, are joined once a round. A batch that spans two blocks of a source anyway, or rows not
shuffled, are taken and joined first.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator, Sequence
from typing import Any, cast

import numpy as np
import pyarrow as pa

from ..convert.arrow_values import arrow_of, take
from ..errors import DataError
from ..planning.phases import Labels
from .blocks import JOINABLE_BYTES, Segment, permutable, permuted
from .fragments import Fragments

__all__ = ["interleaved"]

# Positions whose batches are worked out at once (a whole number of batches, at least one):
# per batch, no Python but a slice (Python per batch was most of a small batch's time:
# docs/adr/0020-measurements-behind-constants.md#mixing).
_SPAN = 1 << 14
# A source's block with at most 1/_NEARLY_USED of its rows left is joined with its next one: the
# sources' blocks end about together, and were joined once a source, 2x the bytes
# (docs/adr/0020-measurements-behind-constants.md#mixing).
_NEARLY_USED = 8


class _Rows:
    """Rows taken in order from one source's shuffled blocks (source ``index``), each block
    cast to the mixture's ``schema`` and given the ``source_column`` once, as it comes."""

    def __init__(
        self,
        blocks: Iterator[Segment],
        schema: pa.Schema,
        where: Callable[[], str],
        index: int,
        source_column: str | None,
    ) -> None:
        self._blocks = blocks
        self._schema = schema
        self._where = where
        self._index = index
        self._source_column = source_column
        self.block: pa.RecordBatch | Fragments | None = None
        self.order: np.ndarray | None = None
        self.at = 0
        self._next: tuple[Any, np.ndarray | None] | None = None  # the next block, taken early

    def take(self, n: int) -> pa.RecordBatch | Fragments:
        """The next ``n`` rows, copied."""
        taken: list[Any] = []
        while n:
            self._load(n)
            got = min(n, self.left)
            assert self.block is not None
            if self.order is None:
                taken.append(self.block.slice(self.at, got))
            else:
                taken.append(take(self.block, self.order[self.at : self.at + got]))
            self.at += got
            n -= got
            self._release()
        if isinstance(taken[0], Fragments):  # a packed source's tokens
            return Fragments.concat(taken)
        return taken[0] if len(taken) == 1 else pa.concat_batches(taken)

    def shuffled(self, n: int) -> bool:
        """Whether the current block is a shuffled record batch (the next one is loaded when
        the current one is used up; ``n``: rows still wanted)."""
        self._load(n)
        return self.order is not None and isinstance(self.block, pa.RecordBatch)

    def advance(self, n: int) -> np.ndarray:
        """The current block's rows of the next ``n`` (all in it), in order."""
        assert self.order is not None
        rows = self.order[self.at : self.at + n]
        self.at += n
        self._release()
        return rows

    def _release(self) -> None:
        # A used-up block is let go at once: it may be a slice holding a whole old join.
        if not self.left:
            self.block = self.order = None

    @property
    def left(self) -> int:
        """Rows of the current block not taken yet."""
        if self.block is None:
            return 0
        return (len(self.order) if self.order is not None else self.block.num_rows) - self.at

    def _load(self, n: int) -> None:
        """The next block, when the current one is used up (``n``: rows still wanted)."""
        while self.block is None or not self.left:  # (a block may hold no rows)
            got = self._taken_next()
            self._next = None
            if got is None:  # the files held fewer rows than their plan counted
                raise DataError(
                    f"{self._where()}: the source's rows ended {n} rows before its plan "
                    "said; were its files changed while reading?"
                )
            (self.block, self.order), self.at = got, 0

    def _taken_next(self) -> tuple[Any, np.ndarray | None] | None:
        """The block after the current one, ready (None: there is none)."""
        if self._next is None:
            segment = next(self._blocks, None)
            if segment is not None:
                self._next = self._ready(*segment)
        return self._next

    def _ready(self, block: Any, order: np.ndarray | None) -> tuple[Any, np.ndarray | None]:
        """A block as read made one of the mixture's: cast to its schema, permuted whole where it
        can be, its source column added."""
        if isinstance(block, (pa.RecordBatch, pa.Table)):  # (a table: flat, in parts)
            if block.schema != self._schema:
                block = block.select(self._schema.names).cast(self._schema)
            if isinstance(block, pa.Table) and not permutable(block.schema):
                block = pa.concat_batches(block.to_batches())  # (cast to a nested type)
            if order is not None and permutable(block.schema):
                # Permuted whole, the batches gather runs of consecutive rows from it
                # (docs/adr/0035-blocks-permuted-whole.md).
                schema, columns = block.schema, list(block.columns)
                del block
                block = permuted(columns, schema, order)
                order = np.arange(block.num_rows)
            if self._source_column is not None:
                which = arrow_of(np.full(block.num_rows, self._index, np.int64))
                block = block.append_column(self._source_column, which)
        return block, order

    def joined_with_next(self, wanted: int) -> tuple[pa.RecordBatch, pa.RecordBatch] | None:
        """The current block's rows left and the next block, when the current one is nearly
        used up (or ends before ``wanted`` more rows) and the next is a shuffled record batch:
        joined with the other sources' blocks now, the next block's first batches need no
        join of their own (None: join the current block alone)."""
        assert isinstance(self.block, pa.RecordBatch) and self.order is not None
        if self.left >= wanted and self.left * _NEARLY_USED > len(self.order):
            return None
        got = self._taken_next()
        if got is None or not isinstance(got[0], pa.RecordBatch) or got[1] is None:
            return None
        return take(self.block, self.order[self.at :]), got[0]

    def extend(self) -> None:
        """Go on to the next block after the current one's rows left, as `joined_with_next`
        gave them (`rebase` then reads both from the join)."""
        assert self._next is not None and self.order is not None
        left = self.left
        self.order = np.concatenate([np.arange(left), cast("np.ndarray", self._next[1]) + left])
        self.block, self.at, self._next = None, 0, None

    def rebase(self, block: pa.RecordBatch) -> None:
        """Read the current block's rows from ``block``, a copy of it (the joined batch's)."""
        assert self.order is not None and block.num_rows >= len(self.order)
        self.block = block


class _Joined:
    """The current blocks of the sources joined into one record batch, joined again when a
    source's block changes: each batch then gathers its rows from it once, on conversion (as
    one source's batch does), instead of taking each source's rows, joining them, then
    gathering them in order (benchmarks/mixing.py, "x one source").

    Joining copies every source's current block each time one of them changes; the sources'
    blocks, sized in bytes and so in proportion to their shares, end about together, and a
    source nearly used up joins its next block then too: about one memory copy of each row,
    far cheaper than the gather and join per batch it saves
    (docs/adr/0020-measurements-behind-constants.md#mixing). The sources then read their blocks
    from the joined batch, so past a join it holds no more memory than the blocks did."""

    def __init__(self, rows: Sequence[_Rows | None]) -> None:
        self._rows = rows
        self.batch: pa.RecordBatch | None = None
        self._starts: dict[int, int] = {}  # each source's block's first row (by its _Rows id)
        self._blocks: dict[int, Any] = {}  # ... and that block, as the joined batch holds it
        self.usable = True  # False: blocks not shuffled, or too large to join

    def batches(self, labels: np.ndarray, batch_size: int) -> tuple[int, np.ndarray]:
        """How many of the batches of positions ``labels`` (the first ones, whole) the
        sources' current blocks hold, and the joined batch's rows of their positions, in order
        (none: take the first batch instead, `_Rows.take`)."""
        k, n = len(self._rows), len(labels)
        counts = np.bincount(
            np.arange(n) // batch_size * k + labels, minlength=-(-n // batch_size) * k
        )
        ends = counts.reshape(-1, k).cumsum(axis=0)  # each source's rows up to each batch's end
        none = np.zeros(0, np.int64)
        sources: dict[int, _Rows] = {}
        for i in np.flatnonzero(ends[-1]).tolist():
            source = sources[i] = cast("_Rows", self._rows[i])  # (it has positions: it has rows)
            if not source.shuffled(int(ends[-1, i])):
                self.usable = False
                return 0, none
        changed = any(self._blocks.get(id(s)) is not s.block for s in sources.values())
        if changed and not self._join({id(s): int(ends[-1, i]) for i, s in sources.items()}):
            self.usable = False
            return 0, none
        fits = len(ends)
        for i, source in sources.items():
            fits = min(fits, int(np.searchsorted(ends[:, i], source.left, side="right")))
        if not fits:  # the first batch spans two blocks of a source
            return 0, none
        wanted = [(sources[i], c) for i, c in enumerate(ends[fits - 1].tolist()) if c]
        grouped = np.concatenate([s.advance(c) + self._starts[id(s)] for s, c in wanted])
        # Row r of the rows (grouped by source, in order) goes to position order[r].
        served = min(n, fits * batch_size)
        order = np.argsort(labels[:served], kind="stable")
        indices = np.empty(served, np.int64)
        indices[order] = grouped
        return fits, indices

    def _join(self, wanted: dict[int, int]) -> bool:
        """Join the sources' current blocks (False: they are too large to). A source whose
        block is nearly used up, or ends before the ``wanted[id(source)]`` rows of the span,
        has its rows left and its next block joined instead: the sources' blocks, sized by
        their weights, end about together, and are then joined once, not once each."""
        live = [r for r in self._rows if r is not None and r.left]
        ahead = [r.joined_with_next(wanted.get(id(r), 0)) for r in live]
        parts = [
            [cast("pa.RecordBatch", r.block)] if a is None else list(a)
            for r, a in zip(live, ahead, strict=True)
        ]
        if sum(b.nbytes for p in parts for b in p) >= JOINABLE_BYTES:  # 32-bit offsets
            if not any(ahead):
                return False
            ahead = [None] * len(live)  # (the next blocks stay next; the current ones may fit)
            parts = [[cast("pa.RecordBatch", r.block)] for r in live]
            if sum(b.nbytes for p in parts for b in p) >= JOINABLE_BYTES:
                return False
        blocks: list[pa.RecordBatch] = [b for p in parts for b in p]
        self.batch = blocks[0] if len(blocks) == 1 else pa.concat_batches(blocks)
        self._starts.clear()
        self._blocks.clear()
        start = 0
        for source, a, part in zip(live, ahead, parts, strict=True):
            rows = sum(b.num_rows for b in part)
            if a is not None:
                source.extend()
            if len(blocks) > 1:
                source.rebase(self.batch.slice(start, rows))
            self._starts[id(source)] = start
            self._blocks[id(source)] = source.block
            start += rows
        return True


def interleaved(
    blocks: Sequence[Iterator[Segment] | None],
    interleave: Labels,
    positions: tuple[int, int],
    batch_size: int,
    schema: pa.Schema,
    *,
    where: Sequence[Callable[[], str]],
    source_column: str | None = None,
) -> Iterator[Segment]:
    """The batches of positions ``[begin, end)`` of a leg's sequence: ``blocks[i]``, source
    ``i``'s shuffled blocks (``None``: it holds none of these positions), in order.

    ``schema``: the mixture's batches' (each source's rows are cast to it); ``where[i]()``
    names source ``i``'s recent files in an error; ``source_column``: also a column of each
    row's source number.
    """
    k = len(blocks)
    rows = [
        _Rows(b, schema, where[i], i, source_column) if b is not None else None
        for i, b in enumerate(blocks)
    ]
    if interleave.turn > 1:
        yield from _sequences(rows, interleave, positions, batch_size)
        return
    joined = _Joined(rows)
    # The batches of a span of positions are worked out together: no Python per batch.
    span = max(1, _SPAN // batch_size) * batch_size
    pos, end = positions
    while pos < end:
        if joined.usable:
            fits, indices = joined.batches(interleave.labels(pos, min(end, pos + span)), batch_size)
            for start in range(0, len(indices), batch_size):
                assert joined.batch is not None
                yield joined.batch, indices[start : start + batch_size]
            pos += len(indices)
            if fits:
                continue
        n = min(batch_size, end - pos)
        labels = interleave.labels(pos, pos + n)
        taken = []
        for i, count in enumerate(np.bincount(labels, minlength=k).tolist()):
            if count:
                source = rows[i]
                assert source is not None, "a source with positions has rows"
                taken.append(source.take(count))
        indices = np.empty(n, np.int64)
        indices[np.argsort(labels, kind="stable")] = np.arange(n)
        yield taken[0] if len(taken) == 1 else pa.concat_batches(taken), indices
        pos += n


def _sequences(
    rows: Sequence[_Rows | None],
    interleave: Labels,
    positions: tuple[int, int],
    batch_size: int,
) -> Iterator[Segment]:
    """`interleaved` for a packed mixture: its positions are tokens given to the sources a
    sequence (``interleave.turn`` tokens) at a time, each source's consecutive sequences taken
    whole from its tokens in order."""
    turn = interleave.turn
    pos, end = positions
    assert pos % turn == 0 and batch_size % turn == 0, "batches of whole sequences"
    while pos < end:
        n = min(batch_size, end - pos)
        labels = interleave.turn_labels(pos // turn, -(-(pos + n) // turn))
        bounds = [0, *(np.flatnonzero(np.diff(labels)) + 1).tolist(), len(labels)]
        taken = []
        for a, b in itertools.pairwise(bounds):  # each source's consecutive sequences
            source = rows[int(labels[a])]
            assert source is not None, "a source with positions has rows"
            taken.append(source.take(min(b * turn, n) - a * turn))
        yield Fragments.concat(taken), None
        pos += n
