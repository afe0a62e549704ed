"""Checks of the `Format` contract: plain functions that raise `AssertionError` on a violation.

Each ``check_*`` function checks one duty of `Format` (see ``formats/base.py``) and names the
chunk, the row range and what differed; `check_format` runs them all on one source. They need
pyarrow only, no test runner.
"""

from __future__ import annotations

import os
import pickle
from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any

import pyarrow as pa
import pyarrow.dataset as ds

from ..formats import Format, FormatPlan, Listing, ReadOptions
from ..fs import FileSystemSpec, ListedFile, Paths, list_files
from ..planning import Chunk
from .forks import check_fork

__all__ = [
    "check_format",
    "check_no_columns",
    "check_pickle",
    "check_plan",
    "check_reads",
    "check_row_ranges",
    "check_schema",
    "read_rows",
]

# Formats pyarrow.dataset reads itself: the independent read of the whole source uses it.
_PYARROW_FORMATS = {
    "parquet": "parquet",
    "orc": "orc",
    "ipc": "ipc",
    "arrow": "ipc",
    "feather": "ipc",
    "csv": "csv",
    "json": "json",
    "jsonl": "json",
}
# Row boundaries tried per chunk; every pair of them is read, so this bounds the reads.
_MAX_BOUNDS = 24
_FRESH = (
    "a copy of the format pickled before planning (as workers and other ranks have it) reads "
    "differently: what read needs of the plan belongs in FormatPlan.read_options, not on the "
    "format"
)


def _expect(ok: bool, message: str) -> None:
    if not ok:  # never `assert`: the checks must hold under `python -O` too
        raise AssertionError(message)


def _where(chunk: Chunk, start: int | None = None, stop: int | None = None) -> str:
    rows = "" if start is None else f" rows [{start}:{stop})"
    return f"chunk {chunk.path} [{chunk.start}:{chunk.stop}){rows}"


def _compare_ids(got: list[Any], want: list[Any], what: str) -> None:
    if got == want:
        return
    missing, extra = Counter(want) - Counter(got), Counter(got) - Counter(want)
    _expect(
        not missing and not extra,
        f"{what}: {len(got)} rows, expected {len(want)}; missing ids {list(missing)[:10]}, "
        f"unexpected or repeated ids {list(extra)[:10]}",
    )
    i = next(i for i, (g, w) in enumerate(zip(got, want, strict=True)) if g != w)
    raise AssertionError(
        f"{what}: the right rows in the wrong order; row {i} is id {got[i]!r}, expected {want[i]!r}"
    )


def read_rows(
    fmt: Format,
    chunk: Chunk,
    row_start: int,
    row_stop: int,
    *,
    fs: FileSystemSpec,
    options: ReadOptions,
    schema: pa.Schema,
) -> pa.Table:
    """Rows ``[row_start, row_stop)`` of ``chunk`` as one table, checking batches and count.

    Raises:
        AssertionError: a batch is not a ``RecordBatch`` of ``schema``, or the row count is wrong.
    """
    where = _where(chunk, row_start, row_stop)
    batches = list(fmt.read(chunk, row_start, row_stop, fs, options))
    for batch in batches:
        _expect(isinstance(batch, pa.RecordBatch), f"{where}: read yielded {type(batch)}")
        got = batch.schema
        _expect(got.equals(schema), f"{where}: yielded schema\n{got}\nnot the plan's\n{schema}")
    table = pa.Table.from_batches(batches, schema=schema)
    rows = row_stop - row_start
    _expect(table.num_rows == rows, f"{where}: read {table.num_rows} rows, not {rows}")
    return table


def check_schema(fmt: Format, file: ListedFile, *, fs: FileSystemSpec, id_column: str) -> pa.Schema:
    """``schema`` of ``file`` is a ``pyarrow.Schema`` holding ``id_column``; returns it."""
    schema = fmt.schema(file, fs)
    _expect(isinstance(schema, pa.Schema), f"schema({file.path}) returned {type(schema)}")
    _expect(id_column in schema.names, f"schema({file.path}) has no column {id_column!r}")
    return schema


def check_plan(
    fmt: Format,
    files: Sequence[ListedFile],
    *,
    fs: FileSystemSpec,
    options: ReadOptions,
    num_rows: int,
) -> FormatPlan:
    """``plan`` is deterministic, in canonical order, consistent, and counts ``num_rows`` rows.

    Canonical order: files in listed order, ranges of one file ascending and disjoint. The
    plan's ``read_options``, if any, are a `ReadOptions` of ``options``' columns.

    Returns:
        The plan.
    """
    listing = Listing.of(files)  # (no hive partitions)
    plan = fmt.plan(listing, fs, options)
    _expect(isinstance(plan, FormatPlan), f"plan returned {type(plan)}, not a FormatPlan")
    planned = plan.read_options
    if planned is not None:
        _expect(isinstance(planned, ReadOptions), f"plan's read_options are {type(planned)}")
        same = planned.columns == options.columns
        _expect(same, f"plan's read_options {planned} read other columns than {options}")
    order = {f.path: i for i, f in enumerate(files)}
    previous: Chunk | None = None
    for chunk in plan.chunks:
        where = _where(chunk)
        _expect(chunk.path in order, f"{where}: not one of the listed files")
        _expect(0 <= chunk.start <= chunk.stop, f"{where}: not a range")
        _expect(chunk.num_rows >= 0 and chunk.num_bytes >= 0, f"{where}: negative size")
        if chunk.unit_rows:
            units_ok = len(chunk.unit_rows) == chunk.stop - chunk.start
            rows_ok = sum(chunk.unit_rows) == chunk.num_rows
            _expect(units_ok and rows_ok, f"{where}: unit_rows disagree: {chunk}")
        if previous is not None:
            before, now = order[previous.path], order[chunk.path]
            in_order = now > before or (now == before and chunk.start >= previous.stop)
            _expect(in_order, f"{where} after {_where(previous)}: not canonical order")
        previous = chunk
    again = fmt.plan(listing, fs, options)
    same = again.chunks == plan.chunks and again.schema.equals(plan.schema)
    _expect(same, f"plan with {options} is not deterministic")
    counted = sum(c.num_rows for c in plan.chunks)
    _expect(counted == num_rows, f"plan with {options} counts {counted} rows, not {num_rows}")
    return plan


def _boundaries(chunk: Chunk) -> list[int]:
    n, edge = chunk.num_rows, 0
    points = {0, 1, n // 2, n - 1, n}
    for rows in chunk.unit_rows[:-1]:  # across native units: both sides of every edge
        edge += rows
        points.update((edge - 1, edge, edge + 1))
    bounds = sorted(p for p in points if 0 <= p <= n)
    if len(bounds) > _MAX_BOUNDS:
        step = (len(bounds) - 1) / (_MAX_BOUNDS - 1)
        bounds = sorted({bounds[round(i * step)] for i in range(_MAX_BOUNDS)})
    return bounds


def check_row_ranges(
    fmt: Format,
    chunk: Chunk,
    full: pa.Table,
    *,
    fs: FileSystemSpec,
    options: ReadOptions,
    schema: pa.Schema,
) -> None:
    """Every ``read(chunk, a, b)`` over boundaries (ends, middle, native unit edges) equals
    ``full.slice(a, b - a)``, where ``full`` is the whole chunk's read."""
    bounds = _boundaries(chunk)
    for i, a in enumerate(bounds):
        for b in bounds[i:]:
            got = read_rows(fmt, chunk, a, b, fs=fs, options=options, schema=schema)
            same = got.equals(full.slice(a, b - a))
            _expect(same, f"{_where(chunk, a, b)}: not that slice of the whole chunk's read")


def check_reads(
    fmt: Format,
    files: Sequence[ListedFile],
    *,
    fs: FileSystemSpec,
    options: ReadOptions,
    id_column: str,
    ids: Sequence[Any],
) -> FormatPlan:
    """Plan with ``options``, read every chunk and its sub-ranges with the plan's read options,
    and every chunk again with a copy of ``fmt`` pickled before planning (as a worker or
    another rank has it: what ``read`` needs of the plan must be in its read options); rows
    must be ``ids`` (compared when the plan's columns include ``id_column``).

    Returns:
        The plan.
    """
    try:
        fresh: Format = pickle.loads(pickle.dumps(fmt))
    except Exception:  # check_pickle names the failure; read twice with fmt then
        fresh = fmt
    plan = check_plan(fmt, files, fs=fs, options=options, num_rows=len(ids))
    reading = plan.read_options or options
    got: list[Any] = []
    schema = plan.schema
    try:
        for chunk in plan.chunks:
            full = read_rows(fmt, chunk, 0, chunk.num_rows, fs=fs, options=reading, schema=schema)
            try:
                again = read_rows(
                    fresh, chunk, 0, chunk.num_rows, fs=fs, options=reading, schema=schema
                )
            except Exception as exc:
                raise AssertionError(f"{_where(chunk)}: {_FRESH}: {exc}") from exc
            _expect(
                again.equals(full), f"{_where(chunk)}: {_FRESH} (or reads are not deterministic)"
            )
            check_row_ranges(fmt, chunk, full, fs=fs, options=reading, schema=schema)
            if id_column in schema.names:
                got.extend(full.column(id_column).to_pylist())
    finally:
        if fresh is not fmt:
            fresh.close()
    if id_column in schema.names:
        _compare_ids(got, list(ids), f"chunks of the plan with {options}, read in plan order")
    return plan


def check_pickle(
    fmt: Format, chunk: Chunk, *, fs: FileSystemSpec, options: ReadOptions, schema: pa.Schema
) -> None:
    """``fmt`` (after a read) and ``chunk`` pickle with every protocol from 2 and read the
    same; ``fmt`` reads the same after ``close()``, which may be called twice."""
    n = chunk.num_rows
    want = read_rows(fmt, chunk, 0, n, fs=fs, options=options, schema=schema)  # opens handles
    for protocol in range(2, pickle.HIGHEST_PROTOCOL + 1):
        try:
            clone, chunk2 = pickle.loads(pickle.dumps((fmt, chunk), protocol))
        except (pickle.PicklingError, TypeError, AttributeError) as exc:
            what = f"{type(fmt).__name__} or a chunk"
            raise AssertionError(f"{what}: no pickle with protocol {protocol}: {exc!r}") from exc
        same = type(clone) is type(fmt) and chunk2 == chunk
        _expect(same, f"protocol {protocol}: unpickled a different format or chunk")
        got = read_rows(clone, chunk2, 0, n, fs=fs, options=options, schema=schema)
        clone.close()
        _expect(got.equals(want), f"{_where(chunk)}: reads differently after unpickling")
    fmt.close()
    got = read_rows(fmt, chunk, 0, n, fs=fs, options=options, schema=schema)
    fmt.close()
    fmt.close()
    _expect(got.equals(want), f"{_where(chunk)}: reads differently after close()")


def check_format(
    fmt: Format,
    source: Paths,
    *,
    id_column: str,
    fs: FileSystemSpec | None = None,
    storage_options: Mapping[str, Any] | None = None,
    expected: pa.Table | None = None,
    columns: Sequence[str] | None = None,
) -> None:
    """Check every duty of the `Format` contract on ``source`` (no hive partitions), fork
    safety included (`check_fork`).

    Args:
        fmt: the format under test.
        source: the files to read, as `create_dataloader` takes them; use several files, an
            empty one, and native units (row groups, stripes) of different sizes.
        id_column: a column of hashable values identifying rows, to compare rows by.
        fs: the filesystem; by default the one of ``source``'s (first) path.
        storage_options: fsspec options for the default ``fs``.
        expected: the whole source read independently (only ``id_column`` is compared); by
            default ``pyarrow.dataset`` reads it when it knows ``fmt.name``.
        columns: the projection to check; by default the last column and ``id_column``.

    Raises:
        AssertionError: the format breaks its contract; the message says where and how.
        ValueError: ``expected`` is needed (pyarrow does not read ``fmt.name``).
        InvalidSourceError: ``source`` lists no files (and the other listing errors).
    """
    if fs is None:
        first = source if isinstance(source, str | os.PathLike) else source[0]
        fs = FileSystemSpec.for_path(first, storage_options)
    files = list_files(source, fs)
    if expected is None:
        kind = _PYARROW_FORMATS.get(fmt.name)
        if kind is None:
            raise ValueError(f"pyarrow does not read {fmt.name!r}: pass expected=")
        expected = pa.concat_tables(
            ds.dataset(f.path, format=kind, filesystem=fs.arrow()).to_table(
                columns=[id_column], use_threads=False
            )
            for f in files
        )
    ids = expected.column(id_column).to_pylist()
    schema = check_schema(fmt, files[0], fs=fs, id_column=id_column)
    plan = check_reads(fmt, files, fs=fs, options=ReadOptions(), id_column=id_column, ids=ids)
    where = f"plan's schema\n{plan.schema}\nis not {files[0].path}'s"
    _expect(plan.schema.equals(schema), f"{where}\n{schema}")
    if plan.chunks:  # one with rows, if any, so that the reads compare something
        chunk = next((c for c in plan.chunks if c.num_rows), plan.chunks[0])
        reading = plan.read_options or ReadOptions()
        check_pickle(fmt, chunk, fs=fs, options=reading, schema=plan.schema)
        check_fork(fmt, chunk, fs=fs, options=reading, schema=plan.schema)
    size = sum(c.num_bytes for c in plan.chunks)
    for options in (
        ReadOptions(split_rows=1),
        ReadOptions(split_rows=len(ids) // 3 + 1),
        ReadOptions(split_bytes=size // 3 + 1),
        ReadOptions(split_rows=len(ids) // 2 + 1, split_bytes=size // 4 + 1),
    ):  # regrouping: the same rows in the same order, whatever the chunks
        check_reads(fmt, files, fs=fs, options=options, id_column=id_column, ids=ids)
    if columns is None:
        columns = list(dict.fromkeys((schema.names[-1], id_column)))
    projected = ReadOptions(columns=tuple(columns))
    plan = check_reads(fmt, files, fs=fs, options=projected, id_column=id_column, ids=ids)
    names = plan.schema.names
    _expect(names == list(columns), f"projecting {list(columns)} planned columns {names}")
    check_no_columns(fmt, files, fs=fs, num_rows=len(ids))
    fmt.close()


def check_no_columns(
    fmt: Format, files: Sequence[ListedFile], *, fs: FileSystemSpec, num_rows: int
) -> None:
    """``columns=()`` (how the loader counts rows, and projects hive partition keys only):
    the plan counts ``num_rows`` rows under an empty schema, and each chunk's read yields its
    ``num_rows`` rows with no columns."""
    options = ReadOptions(columns=())
    plan = check_plan(fmt, files, fs=fs, options=options, num_rows=num_rows)
    _expect(not plan.schema.names, f"columns=() planned columns {plan.schema.names}")
    reading = plan.read_options or options
    for chunk in plan.chunks:
        try:
            read_rows(fmt, chunk, 0, chunk.num_rows, fs=fs, options=reading, schema=plan.schema)
        except AssertionError as exc:
            raise AssertionError(f"reading with columns=(): {exc}") from exc
