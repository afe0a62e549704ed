"""The Delta Lake table kind: tables read by path (``format="delta"``; `sources.tables`).

`DeltaTables.open` finds the table and pins its version through deltalake (`log`), takes its
schema and column mapping (`mapping`) and the row filter; `DeltaTable.files` lists the
version's live data files (deltalake's add actions), prunes them by partition values and
statistics (`pruning`), reads their Parquet footers for the row groups and their deletion
vectors (`actions`, `sources.deletion_vectors`) for the deleted rows. This module imports no
deltalake at import: the registry names it, and deltalake is imported when a table is opened.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ..errors import CorruptFileError, FilterTypeError
from ..formats import Format, ReadOptions
from ..formats.opening import each_file
from ..formats.parquet.footer import file_metadata
from ..fs import FileSystemSpec
from ..sources.deletion_vectors import DeltaDeletionVector, read_delta_dv
from ..sources.tables import TableFile, TableFilter, TableRequest, TableSchema, TableVersion
from .actions import deletion_vectors, log_path
from .log import PinnedLog, open_log, require_deltalake
from .mapping import parse_fields, plain_schema
from .options import DeltaFileInfo, DeltaReadOptions
from .pruning import kept_files

__all__ = ["DeltaTable", "DeltaTables"]


class DeltaTables:
    """The ``delta`` table kind (`sources.tables.TableKind`).

    Raises:
        MissingDependencyError: deltalake is not installed (when made).
    """

    name = "delta"

    def __init__(self) -> None:
        require_deltalake()

    def format(self) -> Format:
        """`DeltaFormat`: Parquet data files with deletion vectors and column mapping."""
        from .format import DeltaFormat

        return DeltaFormat()

    def open(self, request: TableRequest, fs: FileSystemSpec) -> DeltaTable:
        """Open the table at ``request.table`` and pin the version asked for (the latest by
        default).

        Raises:
            StorageNotFoundError: no Delta table there.
            InvalidArgumentError: no such version; a time before the first commit; a ``ref``
                or ``since``.
            UnsupportedTableError: a reader feature this library does not read.
            FilterTypeError: the filter is not a ``pyarrow.compute.Expression``.
        """
        location = str(request.table)
        label = f"Delta table {location}"
        if request.filters is not None and not isinstance(request.filters, pc.Expression):
            raise FilterTypeError(
                f"{label}: filters must be a pyarrow.compute.Expression (pc.field(...)), got "
                f"{type(request.filters).__name__}"
            )
        log = open_log(location, fs, request.version, label)
        # Remote: the table's protocol, read under each rank's own options (never shipped).
        storage = None if fs.is_local else FileSystemSpec(fs.protocol)
        return DeltaTable(label, log, TableFilter.of(request.filters), storage)


class DeltaTable:
    """A Delta table at its pinned version (`sources.tables.PinnedTable`).

    Its data files are where its log is: ``storage`` is ``None`` (the dataset's own filesystem)
    for a local table, else the table's protocol without options.
    """

    def __init__(
        self,
        label: str,
        log: PinnedLog,
        row_filter: TableFilter,
        storage: FileSystemSpec | None = None,
    ) -> None:
        table = log.table
        self.storage = storage
        metadata = table.metadata()
        self.label = label
        self.filter = row_filter
        self._log = log
        self._schema_json = table.schema().to_json()
        self._partitions = tuple(metadata.partition_columns)
        mode = str(metadata.configuration.get("delta.columnMapping.mode", "none")).lower()
        self._mapping = None if mode == "none" else mode
        self._arrow = plain_schema(pa.schema(table.schema().to_arrow()))
        fields = parse_fields(self._schema_json)
        self._physical = {f.name: f.physical for f in fields}
        ids = tuple(f.field_id for f in fields)
        by_id = self._mapping is not None and all(i is not None for i in ids)
        self.schema = TableSchema(
            self._arrow,
            matched_by="field_id" if by_id else "name",
            field_ids=tuple(int(i) for i in ids if i is not None) if by_id else (),
        )
        self.version = TableVersion(log.version, {"table_id": metadata.id, "version": log.version})
        features = table.protocol().reader_features or ()
        self._has_dvs = "deletionVectors" in features

    def _data_path(self, path: str, fs: FileSystemSpec) -> str:
        """A data file of the log (relative to the table, or absolute) on ``fs``."""
        decoded = log_path(path)
        if "://" in decoded or decoded.startswith("/"):
            return fs.strip(decoded)
        return f"{self._log.root}/{decoded}"

    def files(self, columns: tuple[str, ...], fs: FileSystemSpec) -> list[TableFile]:
        """The version's live data files that the filter does not prune, by path, with their
        row groups and deleted positions.

        Raises:
            CorruptFileError: a footer or deletion vector cannot be parsed, or disagrees with
                the log.
            StorageError: a file cannot be read.
        """
        actions = pa.table(self._log.table.get_add_actions(flatten=True)).to_pylist()
        actions.sort(key=lambda a: log_path(a["path"]))
        keep = kept_files(actions, self.filter.rows, self._arrow, self._partitions, self._physical)
        actions = [a for a, k in zip(actions, keep, strict=True) if k]
        vectors: Mapping[str, DeltaDeletionVector] = {}
        if self._has_dvs:
            live = [a["path"] for a in actions]
            vectors = deletion_vectors(self._log.root, fs, self._log.version, live)
        read = {self._physical.get(c, c) for c in columns}
        return each_file(lambda a: self._file(a, fs, vectors, read), actions)

    def _file(
        self,
        action: Mapping[str, Any],
        fs: FileSystemSpec,
        vectors: Mapping[str, DeltaDeletionVector],
        read: set[str],
    ) -> TableFile:
        path = self._data_path(action["path"], fs)
        footer = file_metadata(path, fs, int(action["size_bytes"]))
        groups = [footer.row_group(i) for i in range(footer.num_row_groups)]
        rows = tuple(g.num_rows for g in groups)
        records = action.get("num_records")
        if records is not None and sum(rows) != records:
            raise CorruptFileError(
                f"{fs.url(path)}: the footer counts {sum(rows)} rows, the log of {self.label} "
                f"{records}; the file was changed or replaced after it was committed"
            )
        nbytes = tuple(
            sum(
                g.column(j).total_compressed_size
                for j in range(g.num_columns)
                if g.column(j).path_in_schema.split(".")[0] in read
            )
            for g in groups
        )
        dv = vectors.get(log_path(action["path"]))
        deleted = np.empty(0, np.int64)
        if dv is not None:
            deleted = read_delta_dv(dv, self._log.root, fs, data_file=fs.url(path))
        partition = tuple((c, action.get(f"partition.{c}")) for c in self._partitions)
        info = DeltaFileInfo(path, int(action["size_bytes"]), rows, dv, partition)
        return TableFile(
            path=path,
            size=info.size,
            row_groups=rows,
            row_group_bytes=nbytes,
            deleted=deleted,
            info=info,
        )

    def read_options(self, options: ReadOptions, files: Sequence[TableFile]) -> ReadOptions:
        """`DeltaReadOptions`: the schema, column mapping and each data file's facts."""
        return DeltaReadOptions.of(
            options,
            table=self.label,
            root=self._log.root,
            schema_json=self._schema_json,
            arrow=self._arrow,
            mapping=self._mapping,
            partitions=self._partitions,
            files=tuple(f.info for f in files),
        )
