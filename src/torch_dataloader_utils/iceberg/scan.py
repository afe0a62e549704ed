"""pyiceberg's scan planning: the data files (and their delete files) of the pinned snapshot
that the filter does not prune, checked for what this library can read."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from ..errors import InvalidArgumentError
from .errors import UnsupportedTableError
from .snapshots import ResolvedSnapshot

if TYPE_CHECKING:
    from pyiceberg.expressions import BooleanExpression
    from pyiceberg.table import FileScanTask, Table

__all__ = ["scan_tasks"]

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
        if delete.file_format != FileFormat.PARQUET:
            raise UnsupportedTableError(
                f"Iceberg table {name}: delete file {delete.file_path} is "
                f"{delete.file_format.value} (a deletion vector, or ORC/Avro position "
                "deletes); this library applies Parquet position-delete files only. Compact "
                "the table (rewrite_data_files) to apply its deletes"
            )


def scan_tasks(
    table: Table, resolved: ResolvedSnapshot, row_filter: BooleanExpression, name: str
) -> list[FileScanTask]:
    """The scan tasks of the resolved snapshot, pruned by ``row_filter``, in path order.

    A plain read plans the pinned snapshot (partition pruning, then file pruning by column
    bounds, both pyiceberg's); an incremental read plans the files appended after
    ``from_snapshot_id``.

    Raises:
        UnsupportedTableError: equality deletes, non-Parquet data or delete files.
        InvalidArgumentError: pyiceberg refuses the scan (the message says why).
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
    return sorted(tasks, key=lambda t: t.file.file_path)
