"""An Iceberg table's data files as planning counts them: row groups from the manifests (one
row group) or the footers (several, read in threads), deleted positions from every
position-delete file and deletion vector that applies, bytes in the columns read from the
manifests' column sizes.

The rest of planning (chunks, counts, the plan) is every table kind's: `sources.table_planning`.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

from ..errors import CorruptFileError, InvalidSourceError
from ..formats.parquet.footer import file_metadata
from ..fs import FileSystemSpec
from ..fs.threads import PLAN_THREADS
from ..sources.tables import TableFile
from .deletes import DeletePositions, DeletionVector, merge_positions, read_deletes
from .options import DataFileInfo
from .scan import vector_fields
from .storage import protocol_of

if TYPE_CHECKING:
    from pyiceberg.manifest import DataFile
    from pyiceberg.table import FileScanTask, Table

__all__ = ["table_files", "valid_split_offsets"]

# The smallest offset a row group can start at: after the 4-byte "PAR1" magic.
_FIRST_OFFSET = 4


def valid_split_offsets(offsets: Sequence[int] | None, file_size: int) -> list[int] | None:
    """A data file's ``split_offsets`` (its row groups' start offsets), if they can be trusted.

    They must be strictly increasing, at least 4 (after the magic) and inside the file; writers
    have been wrong (Iceberg Java 1.4.0 wrote corrupt ones), and some write none.
    """
    if not offsets:
        return None
    values = [int(o) for o in offsets]
    if values[0] < _FIRST_OFFSET or values[-1] >= file_size:
        return None
    if any(b <= a for a, b in itertools.pairwise(values)):
        return None
    return values


def _row_groups(data: DataFile, path: str, fs: FileSystemSpec) -> tuple[list[int], list[int]]:
    """Rows and compressed bytes of each row group: from the manifest for one row group,
    else from the footer."""
    size = int(data.file_size_in_bytes)
    offsets = valid_split_offsets(data.split_offsets, size)
    if offsets is not None and len(offsets) == 1:
        return [int(data.record_count)], [size - offsets[0]]
    footer = file_metadata(path, fs, size)
    groups = [footer.row_group(i) for i in range(footer.num_row_groups)]
    rows = [g.num_rows for g in groups]
    if sum(rows) != data.record_count:
        raise CorruptFileError(
            f"{fs.url(path)}: the footer counts {sum(rows)} rows, the table's manifest "
            f"{data.record_count}; the file was changed or replaced after it was committed"
        )
    nbytes = [sum(g.column(j).total_compressed_size for j in range(g.num_columns)) for g in groups]
    return rows, nbytes


def _constants(table: Table, data: DataFile) -> tuple[tuple[int, Any], ...]:
    """Identity-partition values of a data file, by source field id."""
    from pyiceberg.transforms import IdentityTransform

    spec = table.metadata.specs().get(data.spec_id)
    if spec is None:
        return ()
    values = []
    for position, field in enumerate(spec.fields):
        value = data.partition[position] if position < len(data.partition) else None
        if isinstance(field.transform, IdentityTransform) and value is not None:
            values.append((field.source_id, value))
    return tuple(values)


def _projected_fraction(data: DataFile, field_ids: set[int]) -> float:
    """The share of a file's bytes in the columns read (manifest column sizes), else 1."""
    sizes = data.column_sizes or {}
    total = sum(sizes.values())
    if not total:
        return 1.0
    return min(1.0, sum(v for k, v in sizes.items() if k in field_ids) / total)


Delete = str | DeletionVector  # a position-delete file (its path) or a deletion vector


def _deletes(task: FileScanTask, fs: FileSystemSpec) -> tuple[Delete, ...]:
    """What deletes rows of a task's data file: its position-delete files' paths (without
    protocol), sorted, then its deletion vector (`scan` narrowed its Puffin files to it)."""
    from pyiceberg.manifest import FileFormat

    paths = sorted(
        fs.strip(d.file_path) for d in task.delete_files if d.file_format != FileFormat.PUFFIN
    )
    vectors = []
    for delete in task.delete_files:
        fields = vector_fields(delete) if delete.file_format == FileFormat.PUFFIN else None
        if fields is not None:
            data_file, offset, size = fields
            path = fs.strip(delete.file_path)
            vectors.append(DeletionVector(path, offset, size, data_file, int(delete.record_count)))
    return (*paths, *sorted(vectors, key=lambda v: (v.path, v.offset)))


def _table_file(
    table: Table,
    task: FileScanTask,
    *,
    fs: FileSystemSpec,
    protocol: str,
    deletes: Mapping[Delete, DeletePositions],
    field_ids: set[int],
) -> TableFile:
    data = task.file
    if protocol_of(data.file_path) != protocol:
        raise InvalidSourceError(
            f"data file {data.file_path} is not on the table's storage ({protocol}://)"
        )
    path = fs.strip(data.file_path)
    rows, nbytes = _row_groups(data, path, fs)
    delete_paths = _deletes(task, fs)
    info = DataFileInfo(
        path=path,
        url=data.file_path,
        size=int(data.file_size_in_bytes),
        row_groups=tuple(rows),
        deletes=delete_paths,
        constants=_constants(table, data),
    )
    fraction = _projected_fraction(data, field_ids)
    return TableFile(
        path=path,
        size=info.size,
        row_groups=info.row_groups,
        row_group_bytes=tuple(round(b * fraction) for b in nbytes),
        deleted=merge_positions((deletes[d] for d in delete_paths), data.file_path),
        info=info,
    )


def table_files(
    table: Table,
    tasks: Sequence[FileScanTask],
    fs: FileSystemSpec,
    protocol: str,
    field_ids: set[int],
) -> list[TableFile]:
    """The data files of ``tasks``, with their row groups and deleted positions: every delete
    file and deletion vector read, then each data file's row groups, in threads (the reads are
    small requests on object storage).

    Raises:
        InvalidSourceError: a data file is not on the table's storage.
        CorruptFileError: a data or delete file or a deletion vector cannot be parsed, or a
            footer disagrees with the manifest.
    """
    delete_paths = list(dict.fromkeys(d for task in tasks for d in _deletes(task, fs)))
    threads = max(1, min(PLAN_THREADS, len(tasks) + len(delete_paths)))
    with ThreadPoolExecutor(threads, thread_name_prefix="tdu-iceberg-plan") as pool:
        parsed = pool.map(lambda delete: read_deletes(delete, fs), delete_paths)
        deletes = dict(zip(delete_paths, parsed, strict=True))
        return list(
            pool.map(
                lambda task: _table_file(
                    table, task, fs=fs, protocol=protocol, deletes=deletes, field_ids=field_ids
                ),
                tasks,
            )
        )
