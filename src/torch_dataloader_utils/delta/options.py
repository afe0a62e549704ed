"""What workers need to read a Delta plan's chunks: the schema, column mapping and each data
file's facts."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from ..sources.deletion_vectors import DeltaDeletionVector
from ..sources.tables import TableReadOptions

__all__ = ["DeltaFileInfo", "DeltaReadOptions"]


@dataclass(frozen=True)
class DeltaFileInfo:
    """One data file of the plan, as its chunks are read.

    Attributes:
        path: the file without protocol (the chunks' ``path``).
        size: its size in bytes.
        row_groups: physical rows of each row group (before deletes).
        deletion_vector: its deletion vector's descriptor (``None``: no deleted rows).
        partition: its partition values by logical column (the file lacks those columns).
    """

    path: str
    size: int
    row_groups: tuple[int, ...]
    deletion_vector: DeltaDeletionVector | None = None
    partition: tuple[tuple[str, Any], ...] = ()

    def first_row(self, row_group: int) -> int:
        """The file-wide ordinal of the first row of ``row_group``."""
        return sum(self.row_groups[:row_group])


@dataclass(frozen=True)
class DeltaReadOptions(TableReadOptions[DeltaFileInfo]):
    """`ReadOptions` of a Delta read: ``columns`` are the table's logical names.

    Attributes:
        table: the table in messages.
        root: the table's location without protocol (on-disk deletion vectors are under it).
        schema_json: the Delta schema of the version read (its fields' physical names, ids).
        arrow: the logical Arrow schema batches are read in.
        mapping: the column mapping mode (``None``, ``"name"`` or ``"id"``).
        partitions: the partition columns.
        files: the data files of the plan.
    """

    root: str = ""
    schema_json: str = ""
    arrow: pa.Schema | None = None
    mapping: str | None = None
    partitions: tuple[str, ...] = ()
