"""The Iceberg table kind: tables read by name through a pyiceberg catalog (`sources.tables`).

`IcebergTables.open` loads the table, resolves and pins the snapshot (`snapshots`), takes the
table's storage from its FileIO properties (`storage`) and both forms of the filter
(`expressions`); `IcebergTable.files` plans pyiceberg's scan (`scan`) and counts its data files
(`planning`). Columns are matched by field id (`projection`). This module imports no pyiceberg
at import (its modules that do are imported inside the methods): the registry names it, and
it is imported when a table is read.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import pyarrow.compute as pc

from ..formats import Format, ReadOptions
from ..fs import FileSystemSpec
from ..sources.tables import (
    TableFile,
    TableFilter,
    TableRequest,
    TableSchema,
    TableVersion,
)
from .catalog import load_table, require_pyiceberg, table_name
from .options import IcebergReadOptions
from .planning import table_files
from .scan import scan_tasks
from .snapshots import ResolvedSnapshot, SnapshotSelector
from .storage import io_storage_options, protocol_of

if TYPE_CHECKING:
    from pyiceberg.expressions import BooleanExpression
    from pyiceberg.table import Table

__all__ = ["IcebergTable", "IcebergTables"]


class IcebergTables:
    """The ``iceberg`` table kind (`sources.tables.TableKind`).

    Raises:
        MissingDependencyError: pyiceberg is not installed (when made).
    """

    name = "iceberg"

    def __init__(self) -> None:
        require_pyiceberg()

    def format(self) -> Format:
        """`IcebergFormat`: Parquet data files read by field id with positional deletes."""
        from .format import IcebergFormat  # (imports pyiceberg: only when a table is read)

        return IcebergFormat()

    def open(self, request: TableRequest, fs: FileSystemSpec) -> IcebergTable:
        """Load the table named ``request.table`` through ``request.catalog``, resolve its
        snapshot, and take its storage and the filter's two forms.

        Raises:
            InvalidArgumentError: a bad table name, catalog config or snapshot selector; no
                such snapshot, branch, tag or time; a filter string pyiceberg cannot parse.
            StorageNotFoundError: no such table.
            ColumnNotFoundError: the filter names a column the table lacks.
            FilterTypeError: the filter is of another type.
        """
        from .expressions import normalize_filter  # (imports pyiceberg, as the two below)

        asked = request.version
        selector = SnapshotSelector.of(
            snapshot_id=asked.version,  # type: ignore[arg-type]  # (checked there)
            as_of=asked.as_of,
            ref=asked.ref,
            from_snapshot_id=asked.since,  # type: ignore[arg-type]
        )
        name = table_name(request.table)
        loaded = load_table(request.table, dict(request.catalog or {}))
        resolved = selector.resolve(loaded, name)
        protocol = protocol_of(loaded.metadata.location)
        storage = FileSystemSpec(protocol, io_storage_options(protocol, loaded.io.properties))
        arrow_filter, iceberg_filter = normalize_filter(request.filters, resolved.schema)
        return IcebergTable(
            name,
            loaded,
            resolved=resolved,
            storage=storage,
            row_filter=TableFilter(arrow_filter, _filter_text(request.filters, iceberg_filter)),
            prune=iceberg_filter,
        )


class IcebergTable:
    """An Iceberg table at its pinned snapshot (`sources.tables.PinnedTable`)."""

    def __init__(
        self,
        name: str,
        table: Table,
        *,
        resolved: ResolvedSnapshot,
        storage: FileSystemSpec,
        row_filter: TableFilter,
        prune: BooleanExpression,
    ) -> None:
        from .projection import arrow_schema

        self.name = name
        self.label = f"Iceberg table {name}"
        self.storage = storage
        self.filter = row_filter
        self._table = table
        self._resolved = resolved
        self._prune = prune  # pyiceberg's form of the filter, for its scan planning
        self._schema_json = resolved.schema.model_dump_json()
        self.schema = TableSchema(
            arrow_schema(self._schema_json, None),
            matched_by="field_id",
            field_ids=tuple(f.field_id for f in resolved.schema.fields),
        )
        self.version = TableVersion(
            resolved.snapshot_id,
            {
                "table_uuid": table.metadata.table_uuid,
                "snapshot_id": resolved.snapshot_id,
                "from_snapshot_id": resolved.from_snapshot_id,
            },
        )

    def files(self, columns: tuple[str, ...], fs: FileSystemSpec) -> list[TableFile]:
        """The data files pyiceberg's scan of the snapshot keeps (partition and file pruning
        with the filter), with their row groups and deleted positions.

        Raises:
            UnsupportedTableError: equality deletes, non-Parquet data or delete files.
            InvalidSourceError: a data file is not on the table's storage.
            CorruptFileError: a data or delete file cannot be parsed.
        """
        from .projection import projected_schema

        field_ids = set(projected_schema(self._schema_json, columns).field_ids)
        tasks = scan_tasks(self._table, self._resolved, self._prune, self.name)
        protocol = protocol_of(self._table.metadata.location)
        return table_files(self._table, tasks, fs, protocol, field_ids)

    def read_options(self, options: ReadOptions, files: Sequence[TableFile]) -> ReadOptions:
        """`IcebergReadOptions`: the schema, the name mapping and each data file's facts."""
        mapping = self._table.name_mapping()
        return IcebergReadOptions.of(
            options,
            table=self.name,
            schema_json=self._schema_json,
            name_mapping_json=mapping.model_dump_json() if mapping else None,
            format_version=self._table.metadata.format_version,
            files=tuple(f.info for f in files),
        )


def _filter_text(filters: Any, iceberg_filter: BooleanExpression) -> str:
    """The filter as the fingerprint knows it, the same in every process: a pyarrow expression
    as given; otherwise pyiceberg's expression, whose repr sorts set literals (the pyarrow form
    converted from it lists them in set order, which differs between processes)."""
    return str(filters) if isinstance(filters, pc.Expression) else repr(iceberg_filter)
