"""Planning a source: listing, footers, filtered row counts and the decoded size of a row.

Everything here reads storage; it runs once per job (on rank 0 under torch.distributed, see
`plan_once`). The pure part of planning lives in `planning/`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa

from ..errors import (
    ColumnNotFoundError,
    InvalidSourceError,
    SchemaMismatchError,
    UnsupportedTypeError,
)
from ..formats import Format, FormatPlan, ReadOptions
from ..formats.partitions import with_partition
from ..formats.schemas import check_readable
from ..fs import FileSystemSpec, Paths, SourceFile, hive_partitions, list_files
from ..planning import Chunk, Chunks, Plan
from .counting import count_lengths, count_rows, count_tokens
from .filters import filter_columns

__all__ = [
    "Counts",
    "Planned",
    "Prepared",
    "check_tokens",
    "count_chunks",
    "decoded_row_bytes",
    "finish_source",
    "list_source",
    "plan_source",
    "prepare_source",
]

# Rows read at plan time to measure the decoded size of a row: at most this many, and about
# `_SAMPLE_BYTES` of them by the plan's estimate (the footers' encoded sizes).
_SAMPLE_ROWS = 1024
_SAMPLE_BYTES = 4 << 20
# Rows at least this wide by the plan's estimate are not sampled: decoding one row decodes its whole
# page, and wide values are stored plain, so their estimate is their decoded size
# (docs/adr/0020-measurements-behind-constants.md#the-row-size-sample).
_WIDE_ROW_BYTES = 64 << 10
# When a filter does not apply to the first file, how many others to probe for schema drift.
_DRIFT_PROBE_FILES = 64


@dataclass(frozen=True)
class Planned:
    """What planning a source produced (picklable: rank 0 broadcasts it).

    Everything a read needs from planning is here, never in the format (`Format`): every rank
    and worker reads with its own copy of the format as constructed.

    Attributes:
        read_options: the columns read (output plus filter columns), filter, partition schema,
            and what the format's plan learned for its reads (`FormatPlan.read_options`).
        plan: the plan.
        output_columns: the columns batches carry, when not all read columns.
        decoded_row_bytes: decoded bytes per row, sampled (sizes shuffle blocks).
        fs: the storage the source turned out to be on, when planning found it (an Iceberg
            table's: its protocol and the table's options); each rank reads it with its own
            storage options over these, and its own backend and retries
            (`FileSystemSpec.under`). ``None``: the dataset's own filesystem.
        chunk_tokens: a packed dataset's: the tokens of each chunk's rows (after the filter).
        row_lengths: a token budget's: each row's length (after the filter), in plan order.
    """

    read_options: ReadOptions
    plan: Plan
    output_columns: tuple[str, ...] | None
    decoded_row_bytes: float
    fs: FileSystemSpec | None = None
    chunk_tokens: tuple[int, ...] | None = None
    row_lengths: np.ndarray | None = None


@dataclass(frozen=True)
class Prepared:
    """A source as rank 0 found it before any file's metadata is planned (picklable: it goes
    to every rank, which plans a share of its files, `sources.spread`).

    Attributes:
        path: the source as given.
        files: the listed files, in canonical order.
        partitions: each file's hive partition.
        read_options: what the format plans with.
        wanted: the columns batches carry (all: ``None`` until the plan says).
        needed: the filter's columns.
        partition_schema: the hive keys' schema.
        counting: what planning also counts (``tokens``, ``eos``, ``lengths``).
    """

    path: Paths
    files: list[SourceFile]
    partitions: list[tuple[tuple[str, object], ...]]
    read_options: ReadOptions
    wanted: list[str] | None
    needed: tuple[str, ...]
    partition_schema: pa.Schema
    filters: Any
    partitioning: str | None
    counting: dict[str, Any]

    @property
    def identities(self) -> dict[str, tuple[int, str]]:
        """Each listed file's size and version."""
        return {f.path: (f.size, f.version) for f in self.files}


def list_source(path: Paths, fmt: Format) -> Callable[[FileSystemSpec], list[SourceFile]]:
    """How to list ``path``'s files of ``fmt`` (its companions left out)."""

    def listing(fs: FileSystemSpec) -> list[SourceFile]:
        files = [f for f in list_files(path, fs) if not fmt.companion(f.path)]
        if not files:
            raise InvalidSourceError(f"{path!r} lists no {fmt.name} files, only their companions")
        return files

    return listing


def prepare_source(
    path: Paths,
    files: list[SourceFile],
    fmt: Format,
    fs: FileSystemSpec,
    *,
    columns: Sequence[str] | None,
    filters: Any,
    partitioning: str | None,
    split_bytes: int | None,
    split_rows: int | None,
    tokens: str | None = None,
    eos: bool = False,
    lengths: str | None = None,
) -> Prepared:
    """The listed ``files`` checked and the read options worked out: one file's schema read.

    Raises:
        ColumnNotFoundError: a column in ``columns`` or ``filters`` is not in the data.
        SchemaMismatchError: a hive key is a column.
    """
    # The column names come from the first file with bytes: an empty text file has none.
    probe = next((f for f in files if f.size), files[0])
    if partitioning == "hive":
        partition_schema, partitions = hive_partitions(files)
    else:
        partition_schema, partitions = pa.schema([]), [() for _ in files]
    file_schema = fmt.schema(probe, fs)
    check_readable(file_schema, fs.url(probe.path))
    clash = [k for k in partition_schema.names if k in file_schema.names]
    if clash:
        raise SchemaMismatchError(
            f"{fs.url(probe.path)}: hive partition key(s) {clash} are also columns "
            'of the file; read without partitioning="hive" or rename one of them'
        )
    available = pa.schema(list(file_schema) + list(partition_schema))
    for name, what in ((tokens, "Packing"), (lengths, "TokenBudget")):
        if name is not None:
            check_tokens(available, name, str(path), what)
    # Requested columns are checked against every file by the format's plan (missing
    # everywhere: ColumnNotFoundError; missing in some files: SchemaMismatchError).
    needed = _filter_columns(
        fmt,
        fs,
        filters=filters,
        available=available,
        files=[probe, *(f for f in files if f is not probe)],
        partition_schema=partition_schema,
    )
    wanted = list(columns) if columns is not None else list(available.names)
    for name in (tokens, lengths):  # packing and budgets read their column
        if name is not None and name not in wanted:
            wanted.append(name)
    read = [c for c in dict.fromkeys([*wanted, *needed]) if c not in partition_schema.names]
    read_options = ReadOptions(
        columns=tuple(read) if columns is not None or needed else None,
        filter=filters,
        split_bytes=split_bytes,
        split_rows=split_rows,
        partition_schema=partition_schema,
        tokens=tokens,  # (a format may count them from its metadata: planning only)
    )
    return Prepared(
        path=path,
        files=files,
        partitions=list(partitions),
        read_options=read_options,
        wanted=wanted if columns is not None else None,
        needed=needed,
        partition_schema=partition_schema,
        filters=filters,
        partitioning=partitioning,
        counting={"tokens": tokens, "eos": eos, "lengths": lengths},
    )


def finish_source(
    prepared: Prepared,
    planned: FormatPlan,
    fmt: Format,
    fs: FileSystemSpec,
    counts: Counts | None = None,
) -> Planned:
    """The source's plan from its format's: the rows a filter passes, tokens and lengths
    counted (``counts``, when counted already: `count_chunks`), a row's decoded size measured.

    Raises:
        SchemaMismatchError: the columns read are not readable together.
    """
    p = prepared
    read_options = _final(p, planned)
    partition_schema = p.partition_schema
    # All columns (none asked): the plan's, which may be more than the first file's
    # (WebDataset shards with other extensions).
    wanted = p.wanted or [*planned.schema.names, *partition_schema.names]
    rows, tokens, lengths = counts if counts is not None else count_chunks(p, planned, fmt, fs)
    filtered_rows = None if rows is None else tuple(rows)
    chunk_tokens = None if tokens is None else tuple(tokens)
    row_lengths = None
    if lengths is not None:
        row_lengths = np.concatenate(lengths) if lengths else np.zeros(0, np.int32)
    schema = pa.schema(list(planned.schema) + list(partition_schema))
    check_readable(schema, str(p.path))
    plan = Plan(
        chunks=Chunks.of(planned.chunks),
        schema=pa.schema([schema.field(c) for c in wanted]),
        row_bytes=planned.row_bytes,
        details=Plan.details_of(
            format=fmt.name, columns=wanted, filter=p.filters, hive=p.partitioning
        ),
        filtered_rows=filtered_rows,
        files=p.identities,
    )
    return Planned(
        read_options=read_options,
        plan=plan,
        output_columns=tuple(wanted) if p.needed or p.wanted is not None else None,
        decoded_row_bytes=decoded_row_bytes(plan.chunks, plan.row_bytes, read_options, fmt, fs),
        chunk_tokens=chunk_tokens,
        row_lengths=row_lengths,
    )


def plan_source(
    path: Paths,
    fmt: Format,
    fs: FileSystemSpec,
    *,
    columns: Sequence[str] | None,
    filters: Any,
    partitioning: str | None,
    split_bytes: int | None,
    split_rows: int | None,
    cached: Callable[..., FileSystemSpec] | None = None,
    tokens: str | None = None,
    eos: bool = False,
    lengths: str | None = None,
) -> Planned:
    """List, read footers, count filtered rows, measure rows: everything planning reads, here.

    ``tokens``: a list column whose values in each chunk's rows are counted (a packed
    dataset's), with one more for each document that is not null when ``eos``.
    ``lengths``: a list column whose every row's length is kept (a token budget's index).
    ``cached(fs, identities, trusted=True)``: ``fs`` reading through a node-local cache, so a
    second plan of the same files reads their footers, indexes and scans from it.

    Raises:
        StorageNotFoundError: ``path`` does not exist.
        ColumnNotFoundError: a column in ``columns`` or ``filters`` is not in the data.
        SchemaMismatchError: files disagree on the columns read, or a hive key is a column.
    """
    files = list_source(path, fmt)(fs)
    if cached is not None:  # (the listing just told each identity: nothing to check)
        fs = cached(fs, {f.path: (f.size, f.version) for f in files}, trusted=True)
    prepared = prepare_source(
        path,
        files,
        fmt,
        fs,
        columns=columns,
        filters=filters,
        partitioning=partitioning,
        split_bytes=split_bytes,
        split_rows=split_rows,
        tokens=tokens,
        eos=eos,
        lengths=lengths,
    )
    planned = fmt.plan(prepared.files, prepared.partitions, fs, prepared.read_options)
    return finish_source(prepared, planned, fmt, fs)


Counts = tuple[list[int] | None, list[int] | None, list[np.ndarray] | None]


def count_chunks(
    prepared: Prepared,
    planned: FormatPlan,
    fmt: Format,
    fs: FileSystemSpec,
    chunks: Sequence[int] | None = None,
) -> Counts:
    """What planning counts by reading, of each of the plan's ``chunks`` (indexes; all by
    default): the rows that pass the filter, the tokens (a packed dataset's), every row's
    length (a token budget's), each ``None`` where not asked."""
    read_options = _final(prepared, planned)
    needed = [c for c in prepared.needed if c not in prepared.partition_schema.names]
    counting = prepared.counting
    tokens, lengths = counting["tokens"], counting["lengths"]
    picked: Sequence[Chunk] = planned.chunks
    told = planned.token_counts
    if chunks is not None:
        picked = [planned.chunks[i] for i in chunks]
        told = None if told is None else [told[i] for i in chunks]

    def reading(*column: str) -> ReadOptions:
        return dataclasses.replace(read_options, columns=tuple(dict.fromkeys([*column, *needed])))

    rows = None
    if prepared.filters is not None:
        # Count the rows that pass, reading only the filter's columns: equal batch counts
        # per rank and resuming at a batch need them (docs/concepts/model.md).
        rows = count_rows(picked, fmt, fs, reading())
    counted = None
    if tokens is not None:
        # A packed dataset's order is one of tokens: each chunk's, exact, before any stream.
        counted = count_tokens(
            picked, fmt, fs, reading(tokens), tokens, eos=counting["eos"], told=told
        )
    each = None
    if lengths is not None:
        # A token budget's batches are made from every row's length, before any stream.
        each = count_lengths(picked, fmt, fs, reading(lengths), lengths)
    return rows, counted, each


def _final(prepared: Prepared, planned: FormatPlan) -> ReadOptions:
    """The read options with what the plan learned; the token column is planning's."""
    return dataclasses.replace(planned.read_options or prepared.read_options, tokens=None)


def decoded_row_bytes(
    chunks: Sequence[Chunk],
    row_bytes: float,
    read_options: ReadOptions,
    fmt: Format,
    fs: FileSystemSpec,
) -> float:
    """Decoded bytes per row, measured on the first rows of the first non-empty chunk.

    The footers' uncompressed sizes (``row_bytes`` per row) are encoded sizes:
    dictionary-encoded strings can be 100x smaller there than in memory, which would make
    "64 MiB" blocks gigabytes. The sample is about `_SAMPLE_BYTES` (rows of at least
    `_WIDE_ROW_BYTES` are not sampled).
    """
    chunk = next((c for c in chunks if c.num_rows), None)
    if chunk is None:
        return 1.0
    if row_bytes >= _WIDE_ROW_BYTES:
        return row_bytes
    rows = min(chunk.num_rows, _SAMPLE_ROWS, max(1, int(_SAMPLE_BYTES // row_bytes)))
    batches = fmt.read(chunk, 0, rows, fs, read_options)
    try:
        sample = [with_partition(b, chunk.partition, read_options) for b in batches]
    finally:
        fmt.close()
    nbytes = sum(int(b.nbytes) for b in sample)
    rows = sum(int(b.num_rows) for b in sample)
    return float(nbytes / max(1, rows))


def _filter_columns(
    fmt: Format,
    fs: FileSystemSpec,
    *,
    filters: Any,
    available: pa.Schema,
    files: Sequence[SourceFile],
    partition_schema: pa.Schema,
) -> tuple[str, ...]:
    try:
        return filter_columns(filters, available)
    except ColumnNotFoundError as exc:
        # The first file lacks a column: say so if another file has it (schema drift).
        for other in files[1:_DRIFT_PROBE_FILES]:
            schema = pa.schema(list(fmt.schema(other, fs)) + list(partition_schema))
            try:
                filter_columns(filters, schema)
            except ColumnNotFoundError:
                continue
            raise SchemaMismatchError(
                f"{fs.url(files[0].path)} and {fs.url(other.path)} disagree on the "
                f"columns that filters {filters} reads: it applies to the second only"
            ) from exc
        raise ColumnNotFoundError(f"{fs.url(files[0].path)}: {exc}") from exc


def check_tokens(schema: pa.Schema, column: str, where: str, what: str) -> None:
    """Refuse ``what``'s (a packing's, a token budget's) column that is missing or not lists of
    integers.

    Raises:
        ColumnNotFoundError: the column is not in the data.
        UnsupportedTypeError: it does not hold lists of integers.
    """
    if column not in schema.names:
        raise ColumnNotFoundError(
            f"{where}: {what}'s column {column!r} is not a column of the data "
            f"(columns: {schema.names})"
        )
    kind = schema.field(column).type
    if not (
        (pa.types.is_list(kind) or pa.types.is_large_list(kind))
        and pa.types.is_integer(kind.value_type)
    ):
        raise UnsupportedTypeError(
            f"{where}: {what}'s column {column!r} holds {kind}, not lists of integers (token ids)"
        )
