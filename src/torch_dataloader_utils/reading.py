"""Reading a stream's pieces: the format's record batches plus partition columns, checked."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Any

import pyarrow as pa

from .errors import NullValueError
from .formats import Format, ReadOptions
from .fs import FileSystemSpec
from .planning import Chunk, Piece

__all__ = ["read_pieces", "with_partition"]


def with_partition(
    batch: pa.RecordBatch, partition: tuple[tuple[str, Any], ...], options: ReadOptions
) -> pa.RecordBatch:
    """Append the file's hive partition values as constant columns."""
    for key, value in partition:
        assert options.partition_schema is not None  # set whenever files have partitions
        field = options.partition_schema.field(key)
        batch = batch.append_column(field, pa.repeat(pa.scalar(value, field.type), batch.num_rows))
    return batch


def read_pieces(
    pieces: Sequence[Piece],
    chunks: Sequence[Chunk],
    fmt: Format,
    fs: FileSystemSpec,
    options: ReadOptions,
    *,
    rejects_nulls: Callable[[pa.RecordBatch], str | None] | None = None,
) -> Iterator[pa.RecordBatch]:
    """The record batches of ``pieces``, in order, with partition columns appended.

    Args:
        pieces: what to read.
        chunks: the plan's chunks, which pieces index.
        fmt: the format.
        fs: the filesystem.
        options: the read options.
        rejects_nulls: returns the name of a column whose nulls the output cannot take (checked
            here, where the file and rows are known, so the error can name them).

    Raises:
        NullValueError: a column holds nulls ``rejects_nulls`` refuses, naming file and rows.
    """
    try:
        for piece in pieces:
            chunk = chunks[piece.chunk]
            position = piece.start
            for batch in fmt.read(chunk, piece.start, piece.stop, fs, options):
                column = rejects_nulls(batch) if rejects_nulls is not None else None
                if rejects_nulls is not None and column is not None and options.filter is not None:
                    # Nulls the row filter removes are fine: check again after it (rare path).
                    filtered = with_partition(batch, chunk.partition, options).filter(
                        options.filter
                    )
                    column = rejects_nulls(filtered)
                if column is not None:
                    raise NullValueError(
                        f"{fs.url(chunk.path)} (chunk {chunk.start}:{chunk.stop}, rows "
                        f"{position}:{position + batch.num_rows}): column {column!r} holds "
                        'nulls and null_policy="error"; pass null_policy="fill" or "mask", or '
                        "filter the nulls out"
                    )
                position += batch.num_rows
                yield with_partition(batch, chunk.partition, options)
    finally:
        fmt.close()
