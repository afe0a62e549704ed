"""Hive partition values as columns: what a format's batches carry beside the file's own columns
(`ReadOptions.partition_schema` types them)."""

from __future__ import annotations

from typing import Any

import pyarrow as pa

from .base import ReadOptions

__all__ = ["with_partition"]


def with_partition(
    batch: pa.RecordBatch, partition: tuple[tuple[str, Any], ...], options: ReadOptions
) -> pa.RecordBatch:
    """Append the file's hive partition values as constant columns."""
    for key, value in partition:
        assert options.partition_schema is not None  # set whenever files have partitions
        field = options.partition_schema.field(key)
        batch = batch.append_column(field, pa.repeat(pa.scalar(value, field.type), batch.num_rows))
    return batch
