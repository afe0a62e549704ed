"""A mixture's batches: rows taken in order from each source's blocks and placed at the
positions the interleave gives that source (`planning.mixture`, `planning.streams.Mixed`).

Each source's part of a stream is read and shuffled in its own blocks, as one source's stream
is (`stream.pipeline`); this module only puts the batches together, position by position.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np
import pyarrow as pa

from ..convert.arrow_values import arrow_of, take
from ..errors import DataError
from ..planning.phases import Labels
from .blocks import Segment
from .fragments import Fragments

__all__ = ["interleaved"]


class _Rows:
    """Rows taken in order from one source's shuffled blocks."""

    def __init__(
        self, blocks: Iterator[Segment], schema: pa.Schema, where: Callable[[], str]
    ) -> None:
        self._blocks = blocks
        self._schema = schema
        self._where = where
        self._block: pa.RecordBatch | Fragments | None = None
        self._order: np.ndarray | None = None
        self._at = 0

    def take(self, n: int) -> pa.RecordBatch | Fragments:
        parts: list[Any] = []
        while n:
            if self._block is None or self._at >= self._rows():
                segment = next(self._blocks, None)
                if segment is None:  # the files held fewer rows than their plan counted
                    raise DataError(
                        f"{self._where()}: the source's rows ended {n} rows before its plan "
                        "said; were its files changed while reading?"
                    )
                block, self._order = segment
                assert not isinstance(block, pa.Table), "a mixture's blocks are one batch"
                self._block, self._at = block, 0
            got = min(n, self._rows() - self._at)
            assert self._block is not None
            if self._order is None:
                parts.append(self._block.slice(self._at, got))
            else:
                parts.append(take(self._block, self._order[self._at : self._at + got]))
            self._at += got
            n -= got
        if isinstance(parts[0], Fragments):  # a packed source's tokens
            return Fragments.concat(parts)
        batch = parts[0] if len(parts) == 1 else pa.concat_batches(parts)
        if batch.schema != self._schema:
            batch = batch.select(self._schema.names).cast(self._schema)
        return batch

    def _rows(self) -> int:
        if self._order is not None:
            return len(self._order)
        return self._block.num_rows if self._block is not None else 0


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
    rows = [_Rows(b, schema, where[i]) if b is not None else None for i, b in enumerate(blocks)]
    if interleave.unit > 1:
        yield from _sequences(rows, interleave, positions, batch_size)
        return
    pos, end = positions
    while pos < end:
        n = min(batch_size, end - pos)
        labels = interleave.labels(pos, pos + n)
        counts = np.bincount(labels, minlength=k)
        taken: list[Any] = []
        for i, count in enumerate(counts.tolist()):
            if count:
                source = rows[i]
                assert source is not None, "a source with positions has rows"
                taken.append(source.take(count))
        batch = taken[0] if len(taken) == 1 else pa.concat_batches(taken)
        if source_column is not None:
            which = np.repeat(np.arange(k, dtype=np.int64), counts)
            batch = batch.append_column(source_column, arrow_of(which))
        # Row r of ``batch`` (grouped by source, in order) goes to position order[r].
        order = np.argsort(labels, kind="stable")
        indices = np.empty(n, np.int64)
        indices[order] = np.arange(n)
        yield batch, indices
        pos += n


def _sequences(
    rows: Sequence[_Rows | None],
    interleave: Labels,
    positions: tuple[int, int],
    batch_size: int,
) -> Iterator[Segment]:
    """`interleaved` for a packed mixture: its positions are tokens given to the sources a
    sequence (``interleave.unit`` tokens) at a time, each run of one source's sequences taken
    whole from its tokens in order."""
    unit = interleave.unit
    pos, end = positions
    assert pos % unit == 0 and batch_size % unit == 0, "batches of whole sequences"
    while pos < end:
        n = min(batch_size, end - pos)
        labels = interleave.unit_labels(pos // unit, -(-(pos + n) // unit))
        bounds = [0, *(np.flatnonzero(np.diff(labels)) + 1).tolist(), len(labels)]
        parts = []
        for a, b in itertools.pairwise(bounds):  # each run of one source's sequences
            source = rows[int(labels[a])]
            assert source is not None, "a source with positions has rows"
            parts.append(source.take(min(b * unit, n) - a * unit))
        yield Fragments.concat(parts), None
        pos += n
