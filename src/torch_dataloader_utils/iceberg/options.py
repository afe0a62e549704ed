"""What workers need to read an Iceberg plan's chunks: per data file facts and the schema."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import Any

from ..errors import InvalidArgumentError
from ..formats import ReadOptions
from .deletes import DeletionVector

__all__ = ["DataFileInfo", "IcebergReadOptions"]


@dataclass(frozen=True)
class DataFileInfo:
    """One data file of the plan, as its chunks are read.

    Attributes:
        path: the file without protocol (the chunks' ``path``).
        url: the file as the table's manifests name it (delete files name it so).
        size: its size in bytes.
        row_groups: physical rows of each row group (before deletes).
        deletes: what deletes its rows: the position-delete files that apply to it (their
            paths, without protocol), then its deletion vector (format version 3), if any.
        constants: identity-partition values by source field id, for files that lack those
            columns (files added without them, as ``add_files`` allows).
    """

    path: str
    url: str
    size: int
    row_groups: tuple[int, ...]
    deletes: tuple[str | DeletionVector, ...] = ()
    constants: tuple[tuple[int, Any], ...] = ()

    def first_row(self, row_group: int) -> int:
        """The file-wide ordinal of the first row of ``row_group``."""
        return sum(self.row_groups[:row_group])


@dataclass(frozen=True)
class IcebergReadOptions(ReadOptions):
    """`ReadOptions` of an Iceberg read: ``columns`` are the table's column names (resolved to
    each file's columns by field id), plus what each data file needs.

    Attributes:
        table: the table's name, for messages.
        schema_json: the Iceberg schema rows are read in (JSON), whose field ids ``columns``
            are resolved through.
        name_mapping_json: the table's ``schema.name-mapping.default`` (for files without
            field ids), if any.
        format_version: the table's format version.
        files: the data files of the plan.

    The table's storage travels beside them, in `Planned.fs`.
    """

    table: str = ""
    schema_json: str = ""
    name_mapping_json: str | None = None
    format_version: int = 2
    files: tuple[DataFileInfo, ...] = ()

    @cached_property
    def _by_path(self) -> dict[str, DataFileInfo]:
        return {f.path: f for f in self.files}

    def file(self, path: str) -> DataFileInfo:
        """The data file of a chunk.

        Raises:
            InvalidArgumentError: the path is not a data file of this plan.
        """
        try:
            return self._by_path[path]
        except KeyError:
            raise InvalidArgumentError(
                f"{path} is not a data file of the plan of Iceberg table {self.table}"
            ) from None

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state.pop("_by_path", None)  # rebuilt on first use
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
