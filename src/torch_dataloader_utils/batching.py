"""From a stream's rows to batches: blocks, block shuffle, batch cutting (in Arrow)."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from .arrow_values import take
from .planning import block_bounds, block_permutation

__all__ = [
    "DEFAULT_SHUFFLE_BLOCK_BYTES",
    "BatchOptions",
    "Segment",
    "block_sizes",
    "cut_batches",
    "shuffled_blocks",
]

DEFAULT_SHUFFLE_BLOCK_BYTES = 64 * 2**20
# The first block of a stream is small so the first batch comes quickly (8 MiB decoded, at most
# 64k rows); blocks then double. Measured (benchmarks/shuffle_quality.py, files each sorted by
# label): 16k-row first blocks put early batches at 4x the ideal's label skew with 4 ranks, 64k
# at 1.1x; the first batch came 5 ms later in-process, 25 ms with workers.
_FIRST_BLOCK_ROWS = 65_536
_FIRST_BLOCK_BYTES = 8 * 2**20

# Rows of a record batch: all of them in order (None), or these indices in this order.
Segment = tuple[pa.RecordBatch, "np.ndarray | None"]


def block_sizes(
    *, batch_size: int, block_size: int | None, block_bytes: int, row_bytes: float
) -> tuple[int, int]:
    """Rows of a shuffle block and of a stream's first block.

    ``block_size`` rows when given, else about ``block_bytes`` of decoded rows. Blocks sized by
    bytes hold whole batches: a batch that spans two blocks is gathered through an extra copy
    (measured: a third of the token-list throughput).
    """

    def whole(rows: float) -> int:
        return max(1, int(rows) // batch_size) * batch_size

    row_bytes = max(row_bytes, 1.0)
    block_rows = block_size or whole(block_bytes / row_bytes)
    first_rows = whole(min(_FIRST_BLOCK_ROWS, _FIRST_BLOCK_BYTES / row_bytes))
    return block_rows, min(block_rows, first_rows)


@dataclass(frozen=True, slots=True)
class BatchOptions:
    """How a stream's rows become batches.

    Attributes:
        batch_size: rows per batch.
        shuffle: shuffle rows inside blocks.
        block_rows: rows shuffled together (the stream is read in blocks of this many rows).
        first_block_rows: the first block's rows (blocks double up to ``block_rows``).
        seed: shuffle seed.
    """

    batch_size: int
    shuffle: bool
    block_rows: int
    first_block_rows: int
    seed: int


def _groups(
    batches: Iterable[pa.RecordBatch], sizes: Iterable[int]
) -> Iterator[list[pa.RecordBatch]]:
    """Cut the concatenation of ``batches`` into consecutive groups of ``sizes`` rows."""
    it = iter(batches)
    carry: pa.RecordBatch | None = None
    for size in sizes:
        group: list[pa.RecordBatch] = []
        need = size
        while need:
            if carry is None:
                carry = next(it, None)
                if carry is None:
                    break
            if carry.num_rows <= need:
                group.append(carry)
                need -= carry.num_rows
                carry = None
            else:
                group.append(carry.slice(0, need))
                carry = carry.slice(need)
                need = 0
        yield group


def shuffled_blocks(
    batches: Iterable[pa.RecordBatch],
    length: int,
    options: BatchOptions,
    *,
    epoch: int,
    stream: int,
    leg: int = 0,
    start: int = 0,
) -> Iterator[Segment]:
    """Group the stream's ``length`` rows into blocks and draw each block's permutation.

    Block boundaries sit at fixed stream positions, so the result is a pure function of
    ``(seed, epoch, stream, leg, rows)``, whatever batch sizes the reader produced. Yields
    ``(block, permutation)``; the rows are gathered later, straight into the output (see
    ``Converter.fields``). Without shuffling, batches pass through with ``None``.

    To resume at output row ``start``, ``batches`` must begin with the first row of the block
    that holds it (`block_start`; without shuffling, at ``start`` itself): that block is read
    again and the rows of its permutation before ``start`` are skipped.
    """
    if not options.shuffle:
        for batch in batches:
            yield batch, None
        return
    bounds = block_bounds(
        length, block_rows=options.block_rows, first_block_rows=options.first_block_rows
    )
    first = next((i for i, (_, b) in enumerate(bounds) if b > start), len(bounds))
    skip = start - bounds[first][0] if first < len(bounds) else 0
    sizes = [b - a for a, b in bounds[first:]]
    for index, group in enumerate(_groups(batches, sizes), start=first):
        if not group:
            continue
        block = pa.concat_batches(group)
        del group  # one copy of the block at a time
        perm = block_permutation(
            seed=options.seed, epoch=epoch, stream=stream, block=index, n=block.num_rows, leg=leg
        )
        if skip:
            perm, skip = perm[skip:], 0
        yield block, perm


def _length(segment: Segment) -> int:
    batch, rows = segment
    return batch.num_rows if rows is None else len(rows)


def _part(segment: Segment, start: int, stop: int) -> Segment:
    batch, rows = segment
    if rows is None:
        return batch.slice(start, stop - start), None
    return batch, rows[start:stop]


def _join(parts: list[Segment]) -> Segment:
    """One segment from several (a batch that spans blocks): materialised, rare."""
    if len(parts) == 1:
        return parts[0]
    taken = [take(batch, rows) for batch, rows in parts]
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
            head = _part(segment, 0, min(rows, batch_size - pending_rows))
            pending.append(head)
            pending_rows += _length(head)
            offset = _length(head)
            if pending_rows < batch_size:
                continue
            yield _join(pending)
            pending, pending_rows = [], 0
        while rows - offset >= batch_size:
            yield _part(segment, offset, offset + batch_size)
            offset += batch_size
        if offset < rows:
            pending.append(_part(segment, offset, rows))
            pending_rows = rows - offset
    if pending_rows and not drop_short:
        yield _join(pending)
