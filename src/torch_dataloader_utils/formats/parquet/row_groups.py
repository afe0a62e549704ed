"""How a chunk's rows are decoded: the row groups they touch, and rows per decoded batch."""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import pyarrow.parquet as pq

from ...planning import Chunk
from .facts import leaf_owners

__all__ = ["QUICK_BLOCKS", "batch_rows", "ending_at", "quick_rows", "row_group_spans"]

# Why each value below, with the numbers measured: docs/adr/0019-format-measurements.md.
# A decoded batch's most rows, and about its most bytes: it keeps all pyarrow decoded alive.
_READ_BATCH_ROWS = 16_384
_READ_BATCH_BYTES = 8 << 20
# A row group read in batches of a stream's first block at most this many first blocks long:
# its blocks (doubling: 1, 2, 4, 8 first blocks) are then each at most 8 batches, and left in
# parts, not copied (docs/adr/0020-measurements-behind-constants.md#first-blocks).
QUICK_BLOCKS = 15


def row_group_spans(
    chunk: Chunk, row_start: int, row_stop: int
) -> Iterator[tuple[int, int, int, int]]:
    """``(row group, first row, stop row, rows)`` of each row group of ``chunk`` that rows
    ``[row_start, row_stop)`` touch, rows counted inside the row group."""
    first = 0  # row of the chunk where the current row group starts
    for rg, rg_rows in zip(range(chunk.start, chunk.stop), chunk.unit_rows, strict=True):
        lo, hi = max(row_start, first), min(row_stop, first + rg_rows)
        if lo < hi:
            yield rg, lo - first, hi - first, rg_rows
        first += rg_rows
        if first >= row_stop:
            return


def batch_rows(
    metadata: pq.FileMetaData, rg: int, columns: Sequence[str] | None, stop: int | None = None
) -> int:
    """Rows per decoded batch of row group ``rg``: about `_READ_BATCH_BYTES` of the columns
    read (the footer's uncompressed sizes), at most `_READ_BATCH_ROWS`; read only up to row
    ``stop`` of it, batches as even as they can be whose last ends at ``stop`` (`ending_at`)."""
    row_group = metadata.row_group(rg)
    rows = int(row_group.num_rows)
    if row_group.total_byte_size * _READ_BATCH_ROWS <= _READ_BATCH_BYTES * max(rows, 1):
        most = _READ_BATCH_ROWS  # narrow rows, whatever the projection: no column walk
    else:
        owners = leaf_owners(metadata.schema.to_arrow_schema())
        wanted = set(columns) if columns is not None else None
        nbytes = sum(
            int(row_group.column(j).total_uncompressed_size)
            for j, owner in enumerate(owners)
            if wanted is None or owner in wanted
        )
        most = max(1, min(_READ_BATCH_ROWS, _READ_BATCH_BYTES * rows // max(nbytes, 1)))
    return most if stop is None else ending_at(most, stop, rows)


def ending_at(most: int, stop: int, rows: int) -> int:
    """Rows per decoded batch, at most ``most``, of a row group of ``rows`` read up to row
    ``stop``: where ``stop`` falls inside it, the fewest even batches whose last ends at
    ``stop`` (or a row or so past it), so that the rows after it are not decoded. A batch
    costs what its rows cost to decode: 4.1 ms for 16,384 rows of a token-list row group,
    1.2 ms for 4,000 (docs/benchmarks.md#a-streams-last-rows-decoded-no-further)."""
    if not 0 < stop < rows:
        return most
    batches = -(-stop // most)
    return -(-stop // batches)


def quick_rows(rows: int, quick: int, lo: int, hi: int) -> int:
    """Rows per decoded batch of rows ``[lo, hi)`` of a row group decoded in batches of
    ``rows``, when the stream's first block (``quick`` rows; 0: not wanted soon) is among them.

    A first block smaller than a decoded batch would wait for the whole batch: 8,050 rows of
    token lists decoded cold in 65-190 ms, the first block's 3,072 in 26-28 ms. A row group
    longer than `QUICK_BLOCKS` first blocks keeps its batches: read in small ones, its later
    blocks would be copied together from many parts."""
    if 0 < quick < rows and hi - lo <= QUICK_BLOCKS * quick:
        return quick
    return rows
