"""A stream's rows in blocks: block sizes and the block shuffle (where rows are shuffled)."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import TypeAlias, cast

import numpy as np
import pyarrow as pa

from ..convert.arrow_values import arrow_of
from ..planning import Layout
from ..planning.shuffle import BlockOrder
from .fragments import Fragments

__all__ = [
    "BLOCK_PARTS",
    "BLOCK_PARTS_MIN_BATCH",
    "DEFAULT_SHUFFLE_BLOCK_BYTES",
    "JOINABLE_BYTES",
    "Segment",
    "block_sizes",
    "permutable",
    "permuted",
    "permuted_whole",
    "shuffled_blocks",
]

DEFAULT_SHUFFLE_BLOCK_BYTES = 64 * 2**20
# A stream's first block: small for a quick first batch, no smaller for shuffled early batches
# (docs/adr/0020-measurements-behind-constants.md#first-blocks); later blocks double.
_FIRST_BLOCK_ROWS = 65_536
_FIRST_BLOCK_BYTES = 8 * 2**20
# ... and spans at most this many chunks of the plan's mean size: each chunk read before the first
# batch costs a few requests (docs/adr/0020-measurements-behind-constants.md#first-blocks).
_FIRST_BLOCK_CHUNKS = 64

# A shuffle block of at most this many read batches is left in its parts (a `pa.Table`, gathered by
# `convert.parts`) instead of copied into one batch on the decoding thread; more parts would cost
# every output batch a pass each (docs/adr/0015-copies-removed.md).
BLOCK_PARTS = 8
# ... for batches of at least this many rows: smaller ones gather faster from a block the reading
# thread joined (docs/adr/0020-measurements-behind-constants.md#blocks-left-in-parts).
BLOCK_PARTS_MIN_BATCH = 128
# ... when joining it cannot overflow a 32-bit offset column: the converter joins some columns of
# a block left in parts (strings, lists), and such a block is joined here instead, where an
# overflow becomes a clear error naming the files (`stream.pipeline`). A mixture joins its
# sources' current blocks only below it (`stream.mix`).
JOINABLE_BYTES = 2**31 - 1

# Rows read: a record batch, or a packed stream's tokens (`Fragments`).
Rows: TypeAlias = "pa.RecordBatch | Fragments"
# Rows of a record batch (or a shuffle block left in parts, a `pa.Table`; or a packed stream's
# tokens, whose blocks are shuffled as they are grouped): all of them in order (None), or these
# indices in this order.
Segment = tuple["pa.RecordBatch | pa.Table | Fragments", "np.ndarray | None"]


def block_sizes(
    *,
    batch_size: int,
    block_size: int | None,
    block_bytes: int,
    row_bytes: float,
    chunk_rows: float = 0.0,
) -> tuple[int, int]:
    """Rows of a shuffle block and of a stream's first block.

    ``block_size`` rows when given, else about ``block_bytes`` of decoded rows. Blocks sized by
    bytes hold whole batches: a batch that spans two blocks is gathered through an extra copy
    (docs/adr/0020-measurements-behind-constants.md#first-blocks). The first block holds at most
    65,536 rows, 8 MiB decoded, and the rows of `_FIRST_BLOCK_CHUNKS` chunks of ``chunk_rows`` rows
    (the plan's mean; 0: not known), and at least one batch.
    """

    def whole(rows: float) -> int:
        return max(1, int(rows) // batch_size) * batch_size

    row_bytes = max(row_bytes, 1.0)
    block_rows = block_size or whole(block_bytes / row_bytes)
    first = min(_FIRST_BLOCK_ROWS, _FIRST_BLOCK_BYTES / row_bytes)
    if chunk_rows > 0:
        first = min(first, _FIRST_BLOCK_CHUNKS * chunk_rows)
    first_rows = whole(first)
    return block_rows, min(block_rows, first_rows)


def _groups(batches: Iterable[Rows], sizes: Iterable[int]) -> Iterator[list[Rows]]:
    """Cut the concatenation of ``batches`` into consecutive groups of ``sizes`` rows."""
    it = iter(batches)
    carry: Rows | None = None
    for size in sizes:
        group: list[Rows] = []
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
        held = [group]
        del group
        yield held.pop()  # (not kept here while the block is consumed: `shuffled_blocks`)


def shuffled_blocks(
    batches: Iterable[Rows],
    length: int,
    options: Layout,
    *,
    epoch: int,
    stream: int,
    leg: int = 0,
    start: int = 0,
    source: int | None = None,
    parts: int = 1,
    whole: bool = False,
) -> Iterator[Segment]:
    """Group the stream's ``length`` rows into blocks and draw each block's permutation.

    Block boundaries sit at fixed stream positions, so the result is a pure function of
    ``(seed, epoch, stream, leg, rows)`` (their `BlockOrder`), whatever batch sizes the reader
    produced. Yields ``(block, permutation)`` (``source``: in a mixture, the source of these
    rows of the stream, which keys the permutations too; a packed stream's token rows move by
    whole documents, `Layout.documents`); the rows are gathered later, straight into the
    output (see ``Converter.fields``). Without shuffling, batches pass through with ``None``.

    A block read as at most ``parts`` batches comes as a `pa.Table` over them (no copy; a
    block that is part of one batch, as its slice); one read as more is copied into one record
    batch. With ``whole`` (its consumer permutes flat blocks whole, `permuted_whole`), a block
    of flat columns (`permutable`) stays a table over any number of read batches: the
    permutation copies it anyway, and a copy before it cost a worker 6% of its CPU
    (docs/adr/0035-blocks-permuted-whole.md).

    To resume at output row ``start``, ``batches`` must begin with the first row of the block
    that holds it (`block_start`; without shuffling, at ``start`` itself): that block is read
    again and the rows of its permutation before ``start`` are skipped.
    """
    if not options.shuffle:
        for batch in batches:
            yield batch, None
        return
    order = BlockOrder(options, length, epoch, stream, leg=leg, source=source)
    bounds = order.bounds()
    first = next((i for i, (_, b) in enumerate(bounds) if b > start), len(bounds))
    skip = start - bounds[first][0] if first < len(bounds) else 0
    sizes = [b - a for a, b in bounds[first:]]
    # Nothing here holds a block while it is consumed (not even `enumerate`, whose reused
    # tuple would), so a block permuted whole lets its source go (`permuted_whole`).
    held: list[Segment] = []
    index = first - 1
    for group in _groups(batches, sizes):
        index += 1
        if not group:
            continue
        if options.documents:  # a packed stream's tokens: moved by whole documents
            tokens = Fragments.concat(cast("list[Fragments]", group))
            del group
            documents = order.documents(index, len(tokens.begin))
            held.append((tokens.permuted(documents).slice(skip), None))
            del tokens
            skip = 0
            yield held.pop()
            continue
        rows = cast("list[pa.RecordBatch]", group)
        del group
        block: pa.RecordBatch | pa.Table
        if len(rows) == 1:
            block = rows[0]
        elif (len(rows) <= parts or (whole and permutable(rows[0].schema))) and sum(
            b.nbytes for b in rows
        ) < JOINABLE_BYTES:
            block = pa.Table.from_batches(rows)
        else:
            block = pa.concat_batches(rows)
        del rows  # one copy of the block at a time
        perm = order.permutation(index, block.num_rows)
        if skip:
            perm, skip = perm[skip:], 0
        held.append((block, perm))
        del block, perm
        yield held.pop()


def _taken_whole(t: pa.DataType) -> bool:
    """Whether pyarrow permutes a column of type ``t`` in one pass faster than output batches
    gather it (fixed-width values, strings, fixed-size lists of fixed-width values); a list
    column's take copies row by row, 1.4x slower on token lists
    (docs/adr/0035-blocks-permuted-whole.md)."""
    if pa.types.is_fixed_size_list(t):
        t = t.value_type
    return bool(
        pa.types.is_primitive(t)
        or pa.types.is_string(t)
        or pa.types.is_binary(t)
        or pa.types.is_large_string(t)
        or pa.types.is_large_binary(t)
    )


def permuted_whole(segments: Iterable[Segment]) -> Iterator[Segment]:
    """Shuffle blocks (`shuffled_blocks`) with their rows put in order (`permuted`), so that
    output batches are zero-copy slices (``None`` rows); blocks with a column of another type
    pass as they are, and are gathered batch by batch (`Converter.fields`).

    It runs on the consuming thread, while the reading thread assembles the next block.
    """
    for segment in segments:
        block, rows = segment
        del segment
        if rows is None or isinstance(block, Fragments) or not permutable(block.schema):
            yield block, rows
            continue
        schema, columns = block.schema, list(block.columns)
        del block  # (its columns are let go one by one)
        yield permuted(columns, schema, rows), None


def permutable(schema: pa.Schema) -> bool:
    """Whether a block of ``schema`` is better permuted whole than gathered batch by batch."""
    return all(_taken_whole(f.type) for f in schema)


def permuted(
    columns: list[pa.Array | pa.ChunkedArray], schema: pa.Schema, rows: np.ndarray
) -> pa.RecordBatch:
    """Rows ``rows`` of a block's ``columns`` in that order, taken column by column. Each
    column is let go (removed from ``columns``) once permuted: a caller that holds the block
    no more holds it about once.

    A column permuted whole reads its source from cache; batches gathering every column in
    turn miss it on each row (tabular rows, batches of 1,024: 0.29 ms a batch converted
    against 1.0; docs/adr/0035-blocks-permuted-whole.md).
    """
    indices = arrow_of(np.asarray(rows, np.int64))
    taken = []
    columns.reverse()
    while columns:
        source = columns.pop()
        # (A column in parts is taken from them, not joined first: pyarrow's take of a
        # chunked column gives one chunk.)
        column = source.take(indices)
        del source
        if isinstance(column, pa.ChunkedArray):  # (one chunk: no copy)
            column = column.chunk(0) if column.num_chunks == 1 else column.combine_chunks()
        taken.append(column)
    return pa.RecordBatch.from_arrays(taken, schema=schema)
