"""Blocks cut into ``batch_size`` batches (in Arrow; rows are gathered later, on conversion)."""

from __future__ import annotations

from collections.abc import Iterable, Iterator

import pyarrow as pa

from ..convert.arrow_values import take
from .blocks import Segment
from .fragments import Fragments

__all__ = ["cut_batches"]


def _length(segment: Segment) -> int:
    batch, rows = segment
    return batch.num_rows if rows is None else len(rows)


def _slice(segment: Segment, start: int, stop: int) -> Segment:
    batch, rows = segment
    if rows is None:
        return batch.slice(start, stop - start), None
    return batch, rows[start:stop]


def _join(segments: list[Segment]) -> Segment:
    """One segment from several (a batch that spans blocks): materialised, rare."""
    if len(segments) == 1:
        return segments[0]
    taken = [take(batch, rows) for batch, rows in segments]
    if isinstance(taken[0], Fragments):  # a packed stream's tokens
        return Fragments.concat(taken), None
    return pa.concat_batches(taken), None


def cut_batches(
    segments: Iterable[Segment], batch_size: int, *, drop_short: bool = False
) -> Iterator[Segment]:
    """Cut consecutive segments into ``batch_size``-row segments; only the last is short.

    A segment is ``(record batch, rows)``: the rows ``rows`` of the batch in that order, or all
    of it when ``rows`` is ``None``. ``drop_short`` drops the short last batch.
    """
    pending: list[Segment] = []
    pending_rows = 0
    for segment in segments:
        offset = 0
        rows = _length(segment)
        if pending_rows:
            head = _slice(segment, 0, min(rows, batch_size - pending_rows))
            pending.append(head)
            pending_rows += _length(head)
            offset = _length(head)
            if pending_rows < batch_size:
                continue
            yield _join(pending)
            pending, pending_rows = [], 0
        while rows - offset >= batch_size:
            yield _slice(segment, offset, offset + batch_size)
            offset += batch_size
        if offset < rows:
            pending.append(_slice(segment, offset, rows))
            pending_rows = rows - offset
    if pending_rows and not drop_short:
        yield _join(pending)
