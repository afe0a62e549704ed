"""pyiceberg's scan planning: the data files (and their delete files) of the pinned snapshot
that the filter does not prune, checked for what this library can read, each task's Puffin
delete files narrowed to the deletion vector of its data file."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from ..errors import CorruptFileError, InvalidArgumentError
from .errors import UnsupportedTableError
from .snapshots import ResolvedSnapshot

if TYPE_CHECKING:
    from pyiceberg.expressions import BooleanExpression
    from pyiceberg.manifest import DataFile
    from pyiceberg.table import FileScanTask, Table

__all__ = ["scan_tasks", "vector_fields"]

logger = logging.getLogger(__name__)

_COMPACT_HINT = (
    "Compact the table so that no equality deletes remain before training, e.g. in Spark "
    "CALL <catalog>.system.rewrite_data_files(table => '<table>', options => "
    "map('delete-file-threshold', '1')) and then remove the equality delete files that no "
    "longer apply (Iceberg >= 1.7: CALL <catalog>.system.rewrite_position_delete_files or "
    "the remove-dangling-deletes action), then read the new snapshot; or read a snapshot from "
    "before the deletes (snapshot_id=...)"
)


def _equality_deletes(table: Table, snapshot_id: int) -> list[str]:
    """Equality delete files of the snapshot (reads its delete manifests)."""
    from pyiceberg.manifest import DataFileContent, ManifestContent

    snapshot = table.metadata.snapshot_by_id(snapshot_id)
    if snapshot is None:
        return []
    found = []
    for manifest in snapshot.manifests(table.io):
        if manifest.content != ManifestContent.DELETES:
            continue
        for entry in manifest.fetch_manifest_entry(table.io, discard_deleted=True):
            if entry.data_file.content == DataFileContent.EQUALITY_DELETES:
                found.append(entry.data_file.file_path)
    return found


def _equality_error(name: str, paths: list[str]) -> UnsupportedTableError:
    return UnsupportedTableError(
        f"Iceberg table {name} has {len(paths)} equality delete file(s) (e.g. {paths[0]}), "
        "which this library does not apply: reading would return deleted rows. " + _COMPACT_HINT
    )


def _check(task: FileScanTask, name: str) -> None:
    from pyiceberg.manifest import DataFileContent, FileFormat

    data = task.file
    if data.file_format != FileFormat.PARQUET:
        raise UnsupportedTableError(
            f"Iceberg table {name}: data file {data.file_path} is {data.file_format.value}; "
            "this library reads Parquet data files only. Rewrite the table's data as Parquet "
            "(write.format.default=parquet, then rewrite_data_files)"
        )
    for delete in task.delete_files:
        if delete.content == DataFileContent.EQUALITY_DELETES:
            raise _equality_error(name, [delete.file_path])
        if delete.file_format not in (FileFormat.PARQUET, FileFormat.PUFFIN):
            raise UnsupportedTableError(
                f"Iceberg table {name}: delete file {delete.file_path} is "
                f"{delete.file_format.value} position deletes; this library applies Parquet "
                "position-delete files and Puffin deletion vectors only. Compact the table "
                "(rewrite_data_files) to apply its deletes"
            )


# A deletion vector's fields of its manifest entry (format version 3): the data file it deletes
# rows of, and where its blob is in the Puffin file.
_VECTOR_FIELDS = ("referenced_data_file", "content_offset", "content_size_in_bytes")


def vector_fields(delete: DataFile) -> tuple[str, int, int] | None:
    """A Puffin delete file's ``referenced_data_file``, ``content_offset`` and
    ``content_size_in_bytes``, if its record has them (read with the version 3 schema)."""
    from pyiceberg.manifest import DATA_FILE_TYPE

    names = [field.name for field in DATA_FILE_TYPE[3].fields]
    values = [
        delete[i] if (i := names.index(field)) < len(delete) else None for field in _VECTOR_FIELDS
    ]
    referenced, offset, size = values
    if referenced is None or offset is None or size is None:
        return None
    return str(referenced), int(offset), int(size)


def _vector_entries(table: Table, snapshot_id: int, name: str) -> dict[tuple[str, str], DataFile]:
    """The snapshot's live deletion vectors by (Puffin file, data file), read from its delete
    manifests with the version 3 schema: pyiceberg 0.12 reads manifests with the version 2
    schema, which drops the fields locating a vector.

    Raises:
        CorruptFileError: a Puffin delete file's entry lacks them (the spec requires them).
    """
    from pyiceberg.avro.file import AvroFile
    from pyiceberg.manifest import (
        MANIFEST_ENTRY_SCHEMAS,
        DataFile,
        DataFileContent,
        FileFormat,
        ManifestContent,
        ManifestEntry,
        ManifestEntryStatus,
    )

    snapshot = table.metadata.snapshot_by_id(snapshot_id)
    found: dict[tuple[str, str], DataFile] = {}
    for manifest in snapshot.manifests(table.io) if snapshot is not None else ():
        if manifest.content != ManifestContent.DELETES:
            continue
        with AvroFile[ManifestEntry](
            table.io.new_input(manifest.manifest_path),
            MANIFEST_ENTRY_SCHEMAS[3],
            read_types={-1: ManifestEntry, 2: DataFile},
            read_enums={0: ManifestEntryStatus, 101: FileFormat, 134: DataFileContent},
        ) as reader:
            for entry in reader:
                delete = entry.data_file
                if (
                    entry.status == ManifestEntryStatus.DELETED
                    or delete.file_format != FileFormat.PUFFIN
                ):
                    continue
                fields = vector_fields(delete)
                if fields is None:
                    raise CorruptFileError(
                        f"Iceberg table {name}: manifest {manifest.manifest_path} lists Puffin "
                        f"delete file {delete.file_path} without the referenced_data_file, "
                        "content_offset and content_size_in_bytes that locate a deletion "
                        "vector (format version 3 requires them)"
                    )
                found[(delete.file_path, fields[0])] = delete
    return found


def _narrow_to_vectors(
    table: Table, snapshot_id: int, tasks: list[FileScanTask], name: str
) -> None:
    """Replace each task's Puffin delete files by the deletion vector of its data file (a
    record with the fields locating it), or by nothing when they hold none for it.

    pyiceberg lists every Puffin file whose vectors may apply (by partition), once per file
    however many of its vectors the manifests list: the manifests say which blob is whose.
    """
    from pyiceberg.manifest import FileFormat

    entries: dict[tuple[str, str], DataFile] | None = None
    for task in tasks:
        puffins = {d for d in task.delete_files if d.file_format == FileFormat.PUFFIN}
        if not puffins:
            continue
        kept = task.delete_files - puffins
        for puffin in puffins:
            fields = vector_fields(puffin)
            if fields is not None and fields[0] == task.file.file_path:
                kept.add(puffin)
                continue
            if entries is None:
                entries = _vector_entries(table, snapshot_id, name)
            vector = entries.get((puffin.file_path, task.file.file_path))
            if vector is not None:
                kept.add(vector)
        task.delete_files = kept


def scan_tasks(
    table: Table, resolved: ResolvedSnapshot, row_filter: BooleanExpression, name: str
) -> list[FileScanTask]:
    """The scan tasks of the resolved snapshot, pruned by ``row_filter``, in path order.

    A plain read plans the pinned snapshot (partition pruning, then file pruning by column
    bounds, both pyiceberg's); an incremental read plans the files appended after
    ``from_snapshot_id``.

    A task's Puffin delete files are narrowed to its data file's deletion vector, as a record
    with the fields that locate it (`vector_fields`).

    Raises:
        UnsupportedTableError: equality deletes, non-Parquet data files, delete files neither
            Parquet nor Puffin.
        InvalidArgumentError: pyiceberg refuses the scan (the message says why).
        CorruptFileError: a deletion vector's manifest entry does not locate it.
    """
    snapshot_id = resolved.snapshot_id
    if snapshot_id is None or snapshot_id == resolved.from_snapshot_id:
        return []  # an empty table, or an incremental read of nothing

    def planned(row_filter: BooleanExpression) -> list[FileScanTask]:
        if resolved.from_snapshot_id is not None:
            scan = table.incremental_append_scan(
                from_snapshot_id_exclusive=resolved.from_snapshot_id,
                to_snapshot_id_inclusive=snapshot_id,
                row_filter=row_filter,
            )
            return list(scan.plan_files())
        return list(table.scan(row_filter=row_filter, snapshot_id=snapshot_id).plan_files())

    try:
        try:
            tasks = planned(row_filter)
        except TypeError as exc:
            if "NoneType" not in str(exc):
                raise
            # pyiceberg 0.12 fails to evaluate some filters against a null identity-partition
            # value (apache/iceberg-python#3498). Pruning is an optimisation: plan every file
            # and let the reader filter the rows.
            logger.warning(
                "Iceberg table %s: pyiceberg could not prune files with the filter (a known "
                "pyiceberg 0.12 bug with null partition values); reading every file and "
                "filtering rows",
                name,
            )
            from pyiceberg.expressions import AlwaysTrue

            tasks = planned(AlwaysTrue())
    except (ValueError, NotImplementedError) as exc:
        # pyiceberg refuses equality deletes with a ValueError; look for them by type.
        equality = _equality_deletes(table, snapshot_id)
        if equality:
            raise _equality_error(name, equality) from exc
        raise InvalidArgumentError(
            f"Iceberg table {name}: planning the scan of snapshot {snapshot_id} failed: {exc}"
        ) from exc
    for task in tasks:
        _check(task, name)
    _narrow_to_vectors(table, snapshot_id, tasks, name)
    return sorted(tasks, key=lambda t: t.file.file_path)
