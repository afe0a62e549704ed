"""Planning an Iceberg read: snapshot, scan tasks, row-group chunks counted in live rows.

Runs once per job (rank 0 under torch.distributed; `plan_once` broadcasts the result). It reads
the catalog, the manifests (through pyiceberg's scan), the footers of data files with several
row groups (in parallel threads: a single-row-group file needs only its manifest entry), every
position-delete file that applies, and, with a row filter, the filter's columns.
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow.compute as pc
import pyarrow.parquet as pq

from ..errors import ColumnNotFoundError, CorruptFileError, InvalidSourceError
from ..formats.opening import open_input, parsing
from ..fs import FileSystemSpec
from ..fs.threads import PLAN_THREADS
from ..planning import Chunk, Chunks, Plan
from ..sources.counting import count_lengths, count_rows, count_tokens
from ..sources.files import Planned, check_tokens, decoded_row_bytes
from ..sources.filters import filter_columns
from .catalog import TableName, load_table, table_name
from .deletes import DeletePositions, live_rows, merge_positions, read_position_deletes
from .expressions import normalize_filter
from .format import IcebergFormat
from .options import DataFileInfo, IcebergReadOptions
from .projection import arrow_schema, projected_schema
from .scan import scan_tasks
from .snapshots import SnapshotSelector
from .storage import io_storage_options, protocol_of

if TYPE_CHECKING:
    from pyiceberg.expressions import BooleanExpression
    from pyiceberg.manifest import DataFile
    from pyiceberg.table import FileScanTask, Table

__all__ = ["plan_table", "valid_split_offsets"]

logger = logging.getLogger(__name__)

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


@dataclass(frozen=True)
class _Facts:
    """A data file and, per row group, its live rows and (projected, estimated) bytes."""

    info: DataFileInfo
    live: tuple[int, ...]
    nbytes: tuple[int, ...]


def _footer(path: str, fs: FileSystemSpec) -> pq.FileMetaData:
    url = fs.url(path)

    def read() -> pq.FileMetaData:
        with open_input(path, fs) as source, parsing(url):
            return pq.read_metadata(source)

    return fs.request(read, what=url)


def _row_groups(data: DataFile, path: str, fs: FileSystemSpec) -> tuple[list[int], list[int]]:
    """Rows and compressed bytes of each row group: from the manifest for one row group,
    else from the footer."""
    size = int(data.file_size_in_bytes)
    offsets = valid_split_offsets(data.split_offsets, size)
    if offsets is not None and len(offsets) == 1:
        return [int(data.record_count)], [size - offsets[0]]
    footer = _footer(path, fs)
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


def _file_facts(
    table: Table,
    task: FileScanTask,
    *,
    fs: FileSystemSpec,
    protocol: str,
    deletes: Mapping[str, DeletePositions],
    field_ids: set[int],
) -> _Facts:
    data = task.file
    if protocol_of(data.file_path) != protocol:
        raise InvalidSourceError(
            f"data file {data.file_path} is not on the table's storage ({protocol}://)"
        )
    path = fs.strip(data.file_path)
    rows, nbytes = _row_groups(data, path, fs)
    delete_paths = tuple(sorted(fs.strip(d.file_path) for d in task.delete_files))
    positions = merge_positions((deletes[d] for d in delete_paths), data.file_path)
    live, first = [], 0
    for n in rows:
        live.append(live_rows(positions, first, first + n))
        first += n
    info = DataFileInfo(
        path=path,
        url=data.file_path,
        size=int(data.file_size_in_bytes),
        row_groups=tuple(rows),
        deletes=delete_paths,
        constants=_constants(table, data),
    )
    fraction = _projected_fraction(data, field_ids)
    return _Facts(info, tuple(live), tuple(round(b * fraction) for b in nbytes))


def _chunks(facts: _Facts, split_rows: int | None, split_bytes: int | None) -> list[Chunk]:
    """Consecutive row groups with live rows, grouped to about ``split_rows``/``split_bytes``
    (neither: one row group per chunk); a row group without live rows breaks a run."""
    chunks: list[Chunk] = []
    run: list[int] = []

    def flush() -> None:
        if run:
            units = tuple(facts.live[i] for i in run)
            chunks.append(
                Chunk(
                    path=facts.info.path,
                    start=run[0],
                    stop=run[-1] + 1,
                    num_rows=sum(units),
                    num_bytes=sum(facts.nbytes[i] for i in run),
                    unit_rows=units,
                )
            )
            run.clear()

    for i, rows in enumerate(facts.live):
        if not rows:
            flush()
            continue
        run.append(i)
        total_rows = sum(facts.live[j] for j in run)
        total_bytes = sum(facts.nbytes[j] for j in run)
        if (
            (split_rows is None and split_bytes is None)
            or (split_rows is not None and total_rows >= split_rows)
            or (split_bytes is not None and total_bytes >= split_bytes)
        ):
            flush()
    flush()
    return chunks


def _columns(
    schema_json: str,
    columns: Sequence[str] | None,
    arrow_filter: pc.Expression | None,
    name: str,
    *,
    tokens: str | None = None,
    lengths: str | None = None,
) -> tuple[list[str], tuple[str, ...]]:
    """The columns batches carry (a packed table's ``tokens``, a token budget's ``lengths``
    among them), and those the row filter reads.

    Raises:
        ColumnNotFoundError: a column is not in the table.
        UnsupportedTypeError: ``tokens`` or ``lengths`` does not hold lists of integers.
    """
    available = arrow_schema(schema_json, None)
    needed = filter_columns(arrow_filter, available) if arrow_filter is not None else ()
    wanted = list(columns) if columns is not None else list(available.names)
    for column, what in ((tokens, "Packing"), (lengths, "TokenBudget")):
        if column is not None:
            check_tokens(available, column, f"Iceberg table {name}", what)
            if column not in wanted:  # packing and budgets read their column
                wanted.append(column)
    try:
        projected_schema(schema_json, tuple(wanted))
    except ColumnNotFoundError as exc:
        raise ColumnNotFoundError(f"Iceberg table {name}: {exc}") from exc
    return wanted, needed


def _read_metadata(
    table: Table,
    tasks: Sequence[FileScanTask],
    fs: FileSystemSpec,
    protocol: str,
    field_ids: set[int],
) -> tuple[list[_Facts], int]:
    """Every delete file, then the row groups and live rows of every data file, in threads
    (the reads are small requests on object storage). Returns the facts and the number of
    delete files."""
    delete_paths = sorted({fs.strip(d.file_path) for t in tasks for d in t.delete_files})
    threads = max(1, min(PLAN_THREADS, len(tasks) + len(delete_paths)))
    with ThreadPoolExecutor(threads, thread_name_prefix="tdu-iceberg-plan") as pool:
        parsed = pool.map(lambda path: read_position_deletes(path, fs), delete_paths)
        deletes = dict(zip(delete_paths, parsed, strict=True))
        facts = list(
            pool.map(
                lambda task: _file_facts(
                    table, task, fs=fs, protocol=protocol, deletes=deletes, field_ids=field_ids
                ),
                tasks,
            )
        )
    return facts, len(delete_paths)


def _filter_text(filters: Any, iceberg_filter: BooleanExpression) -> str:
    """The filter as the fingerprint knows it, the same in every process: a pyarrow expression
    as given; otherwise pyiceberg's expression, whose repr sorts set literals (the pyarrow form
    converted from it lists them in set order, which differs between processes)."""
    return str(filters) if isinstance(filters, pc.Expression) else repr(iceberg_filter)


def plan_table(
    table: TableName,
    catalog_config: Mapping[str, Any] | None,
    selector: SnapshotSelector,
    *,
    columns: Sequence[str] | None,
    filters: Any,
    split_bytes: int | None,
    split_rows: int | None,
    user_fs: FileSystemSpec,
    tokens: str | None = None,
    eos: bool = False,
    lengths: str | None = None,
) -> Planned:
    """Plan a read of an Iceberg table: everything that reads the catalog and storage.

    Args:
        user_fs: the dataset's own filesystem, whose storage options (over the table's),
            backend and retries planning reads the table's files with.
        tokens, eos: a packed dataset's token-list column, whose values in each chunk's live
            rows that pass the filter are counted (with one more per list that is not null
            when ``eos``), as `sources.files.plan_source` counts them.
        lengths: a token budget's list column, whose every live row's length (that passes the
            filter) planning keeps (`Planned.row_lengths`).

    Returns:
        The plan, with `IcebergReadOptions`, and as its ``fs`` the table's storage (its
        protocol and FileIO properties) without the user's storage options: each rank reads
        it under its own (`FileSystemSpec.under`), which never travel with the plan.

    Raises:
        InvalidArgumentError: no such snapshot, branch, tag or time; bad catalog config.
        StorageNotFoundError: no such table.
        ColumnNotFoundError: a column in ``columns`` or ``filters`` is not in the table.
        UnsupportedTableError: equality deletes, non-Parquet files, a non-append in an
            incremental read.
        CorruptFileError: a data or delete file cannot be parsed.
    """
    name = table_name(table)
    loaded = load_table(table, catalog_config)
    resolved = selector.resolve(loaded, name)
    protocol = protocol_of(loaded.metadata.location)
    storage = FileSystemSpec(protocol, io_storage_options(protocol, loaded.io.properties))
    fs = storage.under(user_fs)
    schema_json = resolved.schema.model_dump_json()
    arrow_filter, iceberg_filter = normalize_filter(filters, resolved.schema)
    wanted, needed = _columns(
        schema_json, columns, arrow_filter, name, tokens=tokens, lengths=lengths
    )
    read = tuple(dict.fromkeys([*wanted, *needed]))
    field_ids = set(projected_schema(schema_json, read).field_ids)

    tasks = scan_tasks(loaded, resolved, iceberg_filter, name)
    facts, delete_files = _read_metadata(loaded, tasks, fs, protocol, field_ids)
    chunks = [c for f in facts for c in _chunks(f, split_rows, split_bytes)]
    options = IcebergReadOptions(
        columns=read if columns is not None or needed else None,
        filter=arrow_filter,
        split_bytes=split_bytes,
        split_rows=split_rows,
        table=name,
        schema_json=schema_json,
        name_mapping_json=(
            mapping.model_dump_json() if (mapping := loaded.name_mapping()) else None
        ),
        format_version=loaded.metadata.format_version,
        files=tuple(f.info for f in facts),
    )
    fmt = IcebergFormat()
    filtered_rows, chunk_tokens = _counts(
        chunks, fmt, fs, options, needed=needed, tokens=tokens, eos=eos
    )
    row_lengths = None
    if lengths is not None:  # a token budget's length index, every live row's
        counting = dataclasses.replace(options, columns=tuple(dict.fromkeys([lengths, *needed])))
        parts = count_lengths(chunks, fmt, fs, counting, lengths)
        row_lengths = np.concatenate(parts) if parts else np.zeros(0, np.int32)
    rows = sum(c.num_rows for c in chunks)
    plan = Plan(
        chunks=Chunks.of(chunks),
        schema=arrow_schema(schema_json, tuple(wanted)),
        row_bytes=max(1.0, sum(c.num_bytes for c in chunks) / max(1, rows)),
        details=Plan.details_of(
            format="iceberg",
            table_uuid=loaded.metadata.table_uuid,
            snapshot_id=resolved.snapshot_id,
            from_snapshot_id=resolved.from_snapshot_id,
            columns=wanted,
            filter=_filter_text(filters, iceberg_filter),
        ),
        filtered_rows=filtered_rows,
        # Data files are never rewritten in place; the manifest's size still catches a file
        # truncated or replaced behind the catalog's back.
        files={f.info.path: (f.info.size, "") for f in facts},
    )
    logger.info(
        "Iceberg table %s at snapshot %s: %d data files, %d position-delete files, %d live rows",
        name,
        resolved.snapshot_id,
        len(facts),
        delete_files,
        rows,
    )
    return Planned(
        read_options=options,
        plan=plan,
        output_columns=tuple(wanted) if needed or columns is not None else None,
        decoded_row_bytes=decoded_row_bytes(chunks, plan.row_bytes, options, fmt, fs),
        fs=storage,
        chunk_tokens=chunk_tokens,
        row_lengths=row_lengths,
    )


def _counts(
    chunks: Sequence[Chunk],
    fmt: IcebergFormat,
    fs: FileSystemSpec,
    options: IcebergReadOptions,
    *,
    needed: tuple[str, ...],
    tokens: str | None,
    eos: bool,
) -> tuple[tuple[int, ...] | None, tuple[int, ...] | None]:
    """The live rows of each chunk that pass the row filter (``None`` without one), and a
    packed dataset's tokens in them (``None`` unless ``tokens``), reading only the columns
    each count needs."""
    filtered_rows = chunk_tokens = None
    if options.filter is not None:
        counting = dataclasses.replace(options, columns=needed)
        filtered_rows = tuple(count_rows(chunks, fmt, fs, counting))
    if tokens is not None:
        counting = dataclasses.replace(options, columns=tuple(dict.fromkeys([tokens, *needed])))
        chunk_tokens = tuple(count_tokens(chunks, fmt, fs, counting, tokens, eos=eos))
    return filtered_rows, chunk_tokens
