"""Checks of the table contract (`sources.tables`): plain functions that raise `AssertionError`.

A table kind (ours or a third party's) answers planning's questions: its pinned version, its
data files with their row groups and deleted rows, its schema, its storage, the `Format` that
reads its chunks. `check_table` checks every answer on one table, through the same planning
the datasets use (`sources.table_planning`); each ``check_table_*`` function checks one duty.
They need no test runner::

    from torch_dataloader_utils.sources.tables import TableRequest
    from torch_dataloader_utils.testing.tables import check_table

    def test_my_table_kind_conforms(tmp_path):
        live_ids = write_my_table(tmp_path)  # ids of the rows left after the deletes
        check_table(MyTables(), TableRequest(str(tmp_path)), id_column="id",
                    expected=live_ids, change=lambda: commit_another_version(tmp_path))

Write a small table with several data files, several row groups of different sizes, deleted
rows (at row-group edges, a whole row group, a whole file) and a column identifying each row.
"""

from __future__ import annotations

import dataclasses
import pickle
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import pyarrow as pa

from ..errors import ColumnNotFoundError, TorchDataloaderUtilsError
from ..formats import Format
from ..fs import FileSystemSpec
from ..planning import Chunk, rank_span, span_pieces, worker_span
from ..sources.files import Planned
from ..sources.table_planning import plan_table
from ..sources.tables import PinnedTable, TableFile, TableKind, TableRequest, VersionSelector
from .conformance import check_row_ranges, read_rows

__all__ = [
    "check_table",
    "check_table_chunks",
    "check_table_errors",
    "check_table_pinned",
    "check_table_rows",
    "check_table_splits",
    "check_table_streams",
    "check_table_version_change",
]

# (ranks, workers per rank) every row is read exactly once across; rows a batch holds.
_TOPOLOGIES = ((1, 1), (2, 1), (3, 2), (2, 3))
_BATCH = 7


def _expect(ok: bool, message: str) -> None:
    if not ok:  # never `assert`: the checks must hold under `python -O` too
        raise AssertionError(message)


def _name(request: TableRequest) -> str:
    table = request.table
    return table if isinstance(table, str) else ".".join(table)


def _same_ids(got: Sequence[Any], want: Sequence[Any], what: str) -> None:
    missing, extra = Counter(want) - Counter(got), Counter(got) - Counter(want)
    _expect(
        not missing and not extra,
        f"{what}: {len(got)} rows, expected {len(want)}; missing ids {list(missing)[:10]}, "
        f"unexpected or repeated ids {list(extra)[:10]}",
    )


def _read_fs(planned: Planned, fs: FileSystemSpec) -> FileSystemSpec:
    return planned.fs.under(fs) if planned.fs is not None else fs


def _read_schema(table: PinnedTable, planned: Planned) -> pa.Schema:
    """The schema of what the format yields: the columns read (the filter's too), as the
    table's schema has them."""
    arrow = table.schema.arrow
    columns = planned.read_options.columns
    return pa.schema([arrow.field(c) for c in (arrow.names if columns is None else columns)])


def check_table_pinned(kind: TableKind, request: TableRequest, fs: FileSystemSpec) -> PinnedTable:
    """Opening the table twice pins the same version, whose id is among its fingerprint
    details; the label names the table; the schema says how columns are matched."""
    table = kind.open(request, fs)
    again = kind.open(request, fs)
    version = table.version
    _expect(
        (again.version.id, dict(again.version.details)) == (version.id, dict(version.details)),
        f"{table.label}: opened twice, it pins {version} then {again.version}",
    )
    values = {str(v) for v in version.details.values()}
    _expect(
        str(version.id) in values,
        f"{table.label}: the version {version.id!r} is not among its fingerprint details "
        f"{dict(version.details)}: a state saved at another version would resume this one",
    )
    clash = {"format", "columns", "filter"} & set(version.details)
    _expect(not clash, f"{table.label}: version details use the plan's own keys {clash}")
    _expect(_name(request) in table.label, f"label {table.label!r} does not name the table")
    schema = table.schema
    _expect(isinstance(schema.arrow, pa.Schema), f"{table.label}: schema is {schema.arrow!r}")
    _expect(schema.matched_by in ("field_id", "name"), f"matched_by {schema.matched_by!r}")
    if schema.matched_by == "field_id":
        ids = schema.field_ids
        _expect(
            len(ids) == len(schema.arrow) and len(set(ids)) == len(ids),
            f"{table.label}: field ids {ids} are not one per column of {schema.arrow.names}",
        )
    return table


def _files(table: PinnedTable, planned: Planned, fs: FileSystemSpec) -> list[TableFile]:
    """The table's files as planning counted them for ``planned`` (its columns read)."""
    columns = planned.read_options.columns
    return list(table.files(tuple(table.schema.arrow.names if columns is None else columns), fs))


def check_table_chunks(
    table: PinnedTable, planned: Planned, fs: FileSystemSpec, request: TableRequest
) -> None:
    """The chunks are the files' row groups with live rows, in order, each counted in live rows
    (deleted rows left out), none holding a row group without live rows, every such row group
    in exactly one chunk; grouped as ``request``'s split targets say (none: a row group a
    chunk; else a chunk closes when a target is reached, and only then or before a row group
    without live rows).

    ``fs``: the table's storage under the dataset's filesystem.
    """
    files = _files(table, planned, fs)
    live, sizes = {}, {}
    for f in files:
        d = f.deleted
        _expect(
            d.dtype == np.int64 and bool(np.all(np.diff(d) > 0)),
            f"{f.path}: deleted positions are not sorted, unique int64",
        )
        _expect(len(f.row_group_bytes) == len(f.row_groups), f"{f.path}: a size per row group")
        live[f.path], sizes[f.path] = f.live(), f.row_group_bytes
    split_rows, split_bytes = request.split_rows, request.split_bytes
    order = {f.path: i for i, f in enumerate(files)}
    covered: set[tuple[str, int]] = set()
    previous: Chunk | None = None
    for chunk in planned.plan.chunks:
        where = f"chunk {chunk.path} [{chunk.start}:{chunk.stop})"
        _expect(chunk.path in live, f"{where}: not a data file of the version")
        groups = live[chunk.path]
        _expect(0 <= chunk.start < chunk.stop <= len(groups), f"{where}: not row groups")
        units = groups[chunk.start : chunk.stop]
        _expect(
            tuple(chunk.unit_rows) == units and chunk.num_rows == sum(units),
            f"{where}: counts {chunk.unit_rows}, its row groups' live rows are {units}",
        )
        _expect(all(units), f"{where}: holds a row group without live rows")
        if previous is not None:
            later = (order[chunk.path], chunk.start) >= (order[previous.path], previous.stop)
            _expect(later, f"{where}: after [{previous.start}:{previous.stop}) of {previous.path}")
        nbytes = sizes[chunk.path][chunk.start : chunk.stop]
        if split_rows is None and split_bytes is None:
            _expect(len(units) == 1, f"{where}: several row groups without split targets")
        else:
            past_rows = split_rows is not None and sum(units[:-1]) >= split_rows
            past_bytes = split_bytes is not None and sum(nbytes[:-1]) >= split_bytes
            _expect(not (past_rows or past_bytes), f"{where}: goes on past a split target")
            short = (split_rows is None or sum(units) < split_rows) and (
                split_bytes is None or sum(nbytes) < split_bytes
            )
            gap = chunk.stop == len(groups) or not groups[chunk.stop]
            _expect(not short or gap, f"{where}: closed below the split targets")
        covered.update((chunk.path, g) for g in range(chunk.start, chunk.stop))
        previous = chunk
    for path, groups in live.items():
        left = [g for g, rows in enumerate(groups) if rows and (path, g) not in covered]
        _expect(not left, f"{path}: row groups {left} have live rows and no chunk")


def check_table_rows(
    table: PinnedTable,
    planned: Planned,
    fmt: Format,
    fs: FileSystemSpec,
    *,
    id_column: str,
    expected: Sequence[Any],
) -> None:
    """Each chunk reads its ``num_rows`` live rows in the table's schema (every sub-range the
    slice of the whole), rows passing the filter as counted, and all chunks together read
    ``expected`` (the ids of the rows left after the deletes that pass the filter), each
    once."""
    schema = _read_schema(table, planned)
    options, rows_filter = planned.read_options, table.filter.rows
    filtered = planned.plan.filtered_rows
    got: list[Any] = []
    for i, chunk in enumerate(planned.plan.chunks):
        full = read_rows(fmt, chunk, 0, chunk.num_rows, fs=fs, options=options, schema=schema)
        check_row_ranges(fmt, chunk, full, fs=fs, options=options, schema=schema)
        if rows_filter is not None:
            full = full.filter(rows_filter)
            _expect(
                filtered is not None and int(filtered[i]) == full.num_rows,
                f"chunk {i}: {full.num_rows} rows pass the filter, the plan counts "
                f"{None if filtered is None else int(filtered[i])}",
            )
        if id_column in full.column_names:
            got.extend(full.column(id_column).to_pylist())
    if id_column in schema.names:
        _same_ids(got, expected, f"{table.label}: the chunks read")


def check_table_streams(
    planned: Planned, fmt: Format, fs: FileSystemSpec, *, id_column: str, expected: Sequence[Any]
) -> None:
    """Every live row exactly once across the ranks and workers of several topologies, each
    reading its pieces (cut inside chunks) with its own copy of the format, in a shuffled
    chunk order; ``expected``: the ids of the live rows that pass the filter."""
    chunks = planned.plan.chunks
    rows = np.asarray([c.num_rows for c in chunks], dtype=np.int64)
    order = np.random.default_rng(0).permutation(len(chunks))
    total = int(rows.sum())
    options = planned.read_options
    for world_size, workers in _TOPOLOGIES:
        got: list[Any] = []
        for rank in range(world_size):
            span = rank_span(
                total,
                rank=rank,
                world_size=world_size,
                batch_size=_BATCH,
                drop_last=False,
                remainder="uneven",
            )
            for worker in range(workers):
                copy: Format = pickle.loads(pickle.dumps(fmt))  # as a worker has it
                start, stop = worker_span(
                    span, worker=worker, num_workers=workers, batch_size=_BATCH
                )
                for piece in span_pieces(rows[order], order, start, stop):
                    batches = copy.read(chunks[piece.chunk], piece.start, piece.stop, fs, options)
                    for batch in batches:
                        kept = batch if options.filter is None else batch.filter(options.filter)
                        got.extend(kept.column(id_column).to_pylist())
                copy.close()
        _same_ids(got, expected, f"{world_size} ranks of {workers} workers")


def check_table_splits(
    kind: TableKind,
    request: TableRequest,
    table: PinnedTable,
    fs: FileSystemSpec,
    *,
    planned: Planned,
    id_column: str,
    expected: Sequence[Any],
) -> None:
    """Split targets regroup the same row groups (one a chunk with ``split_rows=1``) into the
    same rows; a projection reads its columns. ``planned``: ``request``'s plan."""
    rows = sum(c.num_rows for c in planned.plan.chunks)
    size = sum(c.num_bytes for c in planned.plan.chunks)
    read_fs = _read_fs(planned, fs)
    fmt = kind.format()
    widest = max((c.num_rows for c in planned.plan.chunks), default=0)
    for split_rows, split_bytes in (
        (1, None),
        (2 * widest + 1, None),  # three row groups a chunk where they are even
        (rows // 3 + 1, None),
        (None, size // 3 + 1),
        (rows // 2 + 1, size // 4 + 1),
    ):
        asked = dataclasses.replace(request, split_rows=split_rows, split_bytes=split_bytes)
        split = plan_table(kind, asked, fs)
        check_table_chunks(table, split, read_fs, asked)
        if split_rows == 1:
            _expect(
                all(c.stop - c.start == 1 for c in split.plan.chunks),
                "split_rows=1: a chunk of several row groups",
            )
        check_table_rows(table, split, fmt, read_fs, id_column=id_column, expected=expected)
    names = table.schema.arrow.names
    columns = tuple(dict.fromkeys((names[-1], id_column)))
    projected = plan_table(kind, dataclasses.replace(request, columns=columns), fs)
    got = tuple(projected.plan.schema.names)
    _expect(got == columns, f"{table.label}: columns={columns} planned {got}")
    check_table_rows(table, projected, fmt, read_fs, id_column=id_column, expected=expected)
    fmt.close()


def check_table_errors(
    kind: TableKind,
    request: TableRequest,
    fs: FileSystemSpec,
    *,
    missing_version: int | str | None = None,
) -> None:
    """A column the table lacks, a table that does not exist and (``missing_version``) a
    version it never had are refused at planning with the library's errors, naming the
    table."""
    name = _name(request)
    asked = {
        "a missing column": dataclasses.replace(request, columns=("no_such_column_zq",)),
        "a missing table": dataclasses.replace(request, table=f"{name}_missing_zq"),
    }
    if missing_version is not None:
        asked["a missing version"] = dataclasses.replace(
            request, version=VersionSelector(version=missing_version)
        )
    for what, bad in asked.items():
        try:
            plan_table(kind, bad, fs)
        except TorchDataloaderUtilsError as exc:
            _expect(
                _name(bad) in str(exc),
                f"{what}: the error does not name the table {_name(bad)!r}: {exc}",
            )
            if what == "a missing column":
                _expect(isinstance(exc, ColumnNotFoundError), f"{what}: {exc!r}")
        except Exception as exc:
            raise AssertionError(f"{what}: not one of the library's errors: {exc!r}") from exc
        else:
            raise AssertionError(f"{what} was planned without an error")


def check_table_version_change(
    kind: TableKind,
    request: TableRequest,
    fs: FileSystemSpec,
    *,
    planned: Planned,
    version: int | str | None,
    change: Callable[[], object],
) -> None:
    """After ``change()`` commits a new version, the table opens at another version and plans
    to another fingerprint; asked for the version read before (``version``), it plans to the
    fingerprint it had then."""
    change()
    after = kind.open(request, fs)
    _expect(after.version.id != version, f"{after.label}: still at {version!r} after a commit")
    now = plan_table(kind, request, fs)
    _expect(
        now.plan.fingerprint != planned.plan.fingerprint,
        f"{after.label}: a new version plans to the same fingerprint {now.plan.fingerprint}",
    )
    pinned = dataclasses.replace(request, version=VersionSelector(version=version))
    before = plan_table(kind, pinned, fs)
    _expect(
        before.plan.fingerprint == planned.plan.fingerprint,
        f"{after.label}: version {version!r} asked for plans to {before.plan.fingerprint}, "
        f"it planned to {planned.plan.fingerprint} when current",
    )


def check_table(
    kind: TableKind,
    request: TableRequest,
    *,
    id_column: str,
    expected: Sequence[Any],
    fs: FileSystemSpec | None = None,
    change: Callable[[], object] | None = None,
    missing_version: int | str | None = None,
) -> Planned:
    """Check every duty of the table contract on ``request``'s table.

    Args:
        kind: the table kind under test.
        request: a request of the table, at its current version (or one it selects).
        id_column: a column of hashable values identifying rows.
        expected: the ids of the rows the request reads: left after the deletes, that pass
            its row filter.
        fs: the dataset's filesystem; by default the one of the table's name or path.
        change: commits a new version of the table; checked last (the fingerprint changes,
            the old version still plans as before). Needs a request of the current version.
        missing_version: a version the table never had, to check its refusal.

    Returns:
        The plan of ``request``.

    Raises:
        AssertionError: the kind breaks the contract; the message says where and how.
    """
    if fs is None:
        fs = FileSystemSpec.for_path(_name(request))
    table = check_table_pinned(kind, request, fs)
    planned = plan_table(kind, request, fs)
    details = dict(planned.plan.details)
    _expect(details.get("format") == kind.name, f"plan details {details} name another format")
    for key, value in table.version.details.items():
        _expect(details.get(key) == str(value), f"plan details {details} lack {key}={value!r}")
    again = pickle.loads(pickle.dumps(planned))  # as rank 0 broadcasts it
    replanned = plan_table(kind, request, fs)
    _expect(
        again.plan.fingerprint == replanned.plan.fingerprint == planned.plan.fingerprint,
        f"{table.label}: planning is not deterministic, or the plan does not pickle",
    )
    _expect(planned.fs == table.storage, f"{table.label}: the plan's fs is not its storage")
    read_fs = _read_fs(planned, fs)
    check_table_chunks(table, planned, read_fs, request)
    fmt = kind.format()
    try:
        check_table_rows(table, planned, fmt, read_fs, id_column=id_column, expected=expected)
        check_table_streams(planned, fmt, read_fs, id_column=id_column, expected=expected)
    finally:
        fmt.close()
    check_table_splits(
        kind, request, table, fs, planned=planned, id_column=id_column, expected=expected
    )
    check_table_errors(kind, request, fs, missing_version=missing_version)
    if change is not None:
        check_table_version_change(
            kind, request, fs, planned=planned, version=table.version.id, change=change
        )
    return planned
