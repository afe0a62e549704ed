"""What workers need to read a Delta plan's chunks: the schema, column mapping and each data
file's facts."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import Any

import pyarrow as pa

from ..errors import InvalidArgumentError
from ..formats import ReadOptions
from ..sources.deletion_vectors import DeltaDeletionVector

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
class DeltaReadOptions(ReadOptions):
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

    table: str = ""
    root: str = ""
    schema_json: str = ""
    arrow: pa.Schema | None = None
    mapping: str | None = None
    partitions: tuple[str, ...] = ()
    files: tuple[DeltaFileInfo, ...] = ()

    @cached_property
    def _by_path(self) -> dict[str, DeltaFileInfo]:
        return {f.path: f for f in self.files}

    def file(self, path: str) -> DeltaFileInfo:
        """The data file of a chunk.

        Raises:
            InvalidArgumentError: the path is not a data file of this plan.
        """
        try:
            return self._by_path[path]
        except KeyError:
            raise InvalidArgumentError(
                f"{path} is not a data file of the plan of {self.table}"
            ) from None

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state.pop("_by_path", None)  # rebuilt on first use
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
