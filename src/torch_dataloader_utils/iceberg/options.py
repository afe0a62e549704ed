"""What workers need to read an Iceberg plan's chunks: per data file facts and the schema."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..sources.tables import TableReadOptions
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
class IcebergReadOptions(TableReadOptions[DataFileInfo]):
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

    schema_json: str = ""
    name_mapping_json: str | None = None
    format_version: int = 2
