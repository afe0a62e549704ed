"""The Lance table kind: datasets read by path with pylance (`sources.tables`).

`LanceTables.open` opens the dataset, resolves and pins the version (`opening`); `LanceTable.files`
answers each fragment as a `TableFile`: its first data file names it, its LIVE rows (after its
deletion file) are cut into units, and nothing is listed as deleted, because pylance addresses a
fragment's rows by live row (`format`). Columns are matched by name. This module imports no
pylance at import: the registry names it, and it is imported when a dataset is read.
"""

from __future__ import annotations

import posixpath
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from ..errors import InvalidArgumentError, UnsupportedTableError
from ..formats import Format, ReadOptions
from ..fs import FileSystemSpec
from ..sources.tables import TableFile, TableFilter, TableRequest, TableSchema, TableVersion
from .opening import dataset_uri, open_dataset, require_lance, resolve_version
from .options import FragmentInfo, LanceReadOptions
from .storage import lance_storage_options

if TYPE_CHECKING:
    from lance import LanceDataset

__all__ = ["LanceTable", "LanceTables"]

# A unit (a chunk's row group) holds at most this many live rows, and about this many bytes of
# the columns read: fragments can hold millions of rows, and split targets group units.
UNIT_ROWS = 65536
UNIT_BYTES = 64 << 20


class LanceTables:
    """The ``lance`` table kind (`sources.tables.TableKind`).

    Args:
        unit_rows: the most live rows of a unit (a chunk's row group).
        unit_bytes: about the most bytes of the columns read a unit holds (estimated from its
            fragment's data files).

    Raises:
        MissingDependencyError: pylance is not installed (when made).
        InvalidArgumentError: a unit size below 1.
    """

    name = "lance"

    def __init__(self, *, unit_rows: int = UNIT_ROWS, unit_bytes: int = UNIT_BYTES) -> None:
        require_lance()
        if unit_rows < 1 or unit_bytes < 1:
            raise InvalidArgumentError(
                f"LanceTables: unit_rows and unit_bytes must be >= 1, got {unit_rows}, {unit_bytes}"
            )
        self.unit_rows = unit_rows
        self.unit_bytes = unit_bytes

    def format(self) -> Format:
        """`LanceFormat`: fragments read by live row with pylance."""
        from .format import LanceFormat

        return LanceFormat()

    def open(self, request: TableRequest, fs: FileSystemSpec) -> LanceTable:
        """Open the dataset at ``request.table``, resolve and pin its version.

        Raises:
            StorageNotFoundError: no dataset there.
            InvalidArgumentError: not one path; no such version or tag; ``as_of`` before
                every version; ``since``; a storage option pylance does not take.
        """
        table = request.table
        if not isinstance(table, str):
            raise InvalidArgumentError(f"a Lance dataset is read from one path, got {table!r}")
        label = f"Lance dataset {table}"
        uri = dataset_uri(table, fs)
        storage = lance_storage_options(fs, label)
        dataset = open_dataset(uri, None, label, storage)  # the latest: its versions listed
        selected = resolve_version(dataset, request.version, label)
        if selected != dataset.version:
            dataset = open_dataset(uri, selected, label, storage)
        return LanceTable(
            table,
            uri,
            dataset,
            row_filter=TableFilter.of(request.filters),
            unit_rows=self.unit_rows,
            unit_bytes=self.unit_bytes,
        )


class LanceTable:
    """A Lance dataset at its pinned version (`sources.tables.PinnedTable`)."""

    storage: FileSystemSpec | None = None  # (the dataset's own filesystem)

    def __init__(
        self,
        table: str,
        uri: str,
        dataset: LanceDataset,
        *,
        row_filter: TableFilter,
        unit_rows: int,
        unit_bytes: int,
    ) -> None:
        self.name = table
        self.label = f"Lance dataset {table}"
        self.uri = uri
        self.filter = row_filter
        self._dataset = dataset
        self._unit_rows = unit_rows
        self._unit_bytes = unit_bytes
        version = int(dataset.version)
        self.schema = TableSchema(dataset.schema, matched_by="name")
        # The dataset's folder name identifies it: a copy elsewhere still resumes (its data
        # files' unique names are in the plan's files too).
        table_id = posixpath.basename(uri.rstrip("/")) or uri
        self.version = TableVersion(version, {"table_id": table_id, "version": version})

    def _field_ids(self, columns: tuple[str, ...]) -> set[int]:
        """The field ids of ``columns`` and of the fields nested in them."""
        ids: set[int] = set()
        pending = [f for f in self._dataset.lance_schema.fields() if f.name() in columns]
        while pending:
            field = pending.pop()
            ids.add(field.id())
            pending.extend(field.children())
        return ids

    def files(self, columns: tuple[str, ...], fs: FileSystemSpec) -> list[TableFile]:
        """Each fragment with live rows, in the manifest's order: its first data file names it,
        its live rows cut into units, their bytes estimated from the share of its data files
        that holds ``columns``.

        Raises:
            UnsupportedTableError: a fragment's data files are stored outside the dataset's
                folder (a dataset with other base paths).
        """
        root = fs.strip(self.uri)
        ids = self._field_ids(columns)
        out = []
        for fragment in self._dataset.get_fragments():
            data_files = fragment.data_files()
            if any(d.base_id is not None for d in data_files):
                raise UnsupportedTableError(
                    f"{self.label}: fragment {fragment.fragment_id} has data files under another "
                    "base path, which is not supported"
                )
            path = f"{root}/data/{data_files[0].path}"
            live = int(fragment.count_rows())
            per_row = _row_bytes(data_files, ids, int(fragment.physical_rows))
            units = _units(live, min(self._unit_rows, max(1, int(self._unit_bytes // per_row))))
            size = data_files[0].file_size_bytes
            out.append(
                TableFile(
                    path=path,
                    size=int(size) if size is not None else fs.file_size(path),
                    row_groups=units,
                    row_group_bytes=tuple(max(1, round(rows * per_row)) for rows in units),
                    info=FragmentInfo(path, int(fragment.fragment_id), units),
                )
            )
        return out

    def read_options(self, options: ReadOptions, files: Sequence[TableFile]) -> ReadOptions:
        """`LanceReadOptions`: the dataset's URI, the pinned version and each fragment's units."""
        return LanceReadOptions.of(
            options,
            table=self.name,
            uri=self.uri,
            version=int(self._dataset.version),
            files=tuple(f.info for f in files),
        )


def _row_bytes(data_files: Sequence[Any], ids: set[int], rows: int) -> float:
    """Bytes per row of the fields ``ids`` in a fragment of ``rows`` physical rows: each data
    file's bytes shared evenly among its fields."""
    total = 0.0
    for data_file in data_files:
        fields = [f for f in data_file.fields if f >= 0]
        size = data_file.file_size_bytes or 0
        if fields:
            total += size * len(ids.intersection(fields)) / len(fields)
    return max(total / max(1, rows), 1e-3)


def _units(live: int, unit: int) -> tuple[int, ...]:
    """``live`` rows cut into units of ``unit`` rows (the last one shorter)."""
    full, rest = divmod(live, unit)
    return (unit,) * full + ((rest,) if rest else ())
