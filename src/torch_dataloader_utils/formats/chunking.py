"""Grouping a file's native units (row groups, stripes, record batches) into chunks."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ..planning import Chunk, Chunks
from .base import Listing, Partition, ReadOptions

__all__ = ["file_chunks", "group_units", "unit_chunks"]


def unit_chunks(listing: Listing, units: Sequence[Sequence[tuple[int, int, int]]]) -> Chunks:
    """A chunk of each native unit of each listed file (``units``: each file's ``(index,
    rows, bytes)``, as `group_units` takes them), built as columns: a million native units
    make no `Chunk` object. The columns are those `Chunks.of` makes of `group_units`' chunks
    without split targets (files and partitions numbered in the order their first chunk
    comes), so is the fingerprint."""
    counts = np.fromiter((len(u) for u in units), np.int64, count=len(units))
    flat = np.asarray([u for each in units for u in each], dtype=np.int64).reshape(-1, 3)
    kept = np.flatnonzero(counts)
    numbers: dict[Partition, int] = {}
    partitions, files = listing.partitions, listing.files
    partition = [numbers.setdefault(partitions[i], len(numbers)) for i in kept.tolist()]
    return Chunks.from_arrays(
        paths=[files[i].path for i in kept.tolist()],
        file=np.repeat(np.arange(len(kept)), counts[kept]),
        start=flat[:, 0],
        stop=flat[:, 0] + 1,
        num_rows=flat[:, 1],
        num_bytes=flat[:, 2],
        unit_rows=flat[:, 1],
        unit_offsets=np.arange(len(flat) + 1),
        partitions=list(numbers) or [()],
        partition=np.repeat(np.asarray(partition, np.int64), counts[kept]),
    )


def group_units(
    path: str,
    units: Sequence[tuple[int, int, int]],
    partition: Partition,
    options: ReadOptions,
) -> list[Chunk]:
    """Pack consecutive native units into chunks of about ``split_bytes``/``split_rows``.

    Args:
        path: the file.
        units: ``(index, rows, bytes)`` of each native unit kept (row group, stripe, record
            batch, ...), ascending; a gap in the indices (a pruned one) closes the chunk.
        partition: the file's hive partition values.
        options: the split targets; with neither, each native unit is a chunk.
    """
    if options.split_rows is None and options.split_bytes is None:
        # Default: one native unit per chunk (the loop below gives the same, at twice the cost).
        return [
            Chunk(
                path=path,
                start=index,
                stop=index + 1,
                num_rows=rows,
                num_bytes=size,
                unit_rows=(rows,),
                partition=partition,
            )
            for index, rows, size in units
        ]
    chunks: list[Chunk] = []
    pending: list[tuple[int, int, int]] = []  # the native units of the chunk being grouped
    rows = size = 0

    def flush() -> None:
        nonlocal rows, size
        if pending:
            chunks.append(
                Chunk(
                    path=path,
                    start=pending[0][0],
                    stop=pending[-1][0] + 1,
                    num_rows=rows,
                    num_bytes=size,
                    unit_rows=tuple(r[1] for r in pending),
                    partition=partition,
                )
            )
            pending.clear()
        rows = size = 0

    for u in units:
        if pending and pending[-1][0] + 1 != u[0]:
            flush()  # a pruned native unit closes the chunk: chunks are contiguous ranges
        pending.append(u)
        rows += u[1]
        size += u[2]
        if options.split_rows is None and options.split_bytes is None:
            flush()  # default: one native unit per chunk
        elif (options.split_rows is not None and rows >= options.split_rows) or (
            options.split_bytes is not None and size >= options.split_bytes
        ):
            flush()  # whichever target is reached first closes the chunk
    flush()
    return chunks


def file_chunks(
    listing: Listing, units: Sequence[Sequence[tuple[int, int, int]]], options: ReadOptions
) -> Sequence[Chunk]:
    """The chunks of each listed file's native ``units``: as columns without split targets
    (`unit_chunks`), grouped by `group_units` with them."""
    if options.split_rows is None and options.split_bytes is None:
        return unit_chunks(listing, units)
    return [
        c
        for f, u, partition in zip(listing.files, units, listing.partitions, strict=True)
        for c in group_units(f.path, u, partition, options)
    ]
