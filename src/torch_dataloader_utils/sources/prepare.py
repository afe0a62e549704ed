"""Preparing a source before its files are planned: its listing, and the read options worked
out from one file's schema (`Prepared`), on rank 0.

What comes after (the format's plan, the counts, a row's decoded size) is `files`'.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from ..errors import (
    ColumnNotFoundError,
    InvalidSourceError,
    SchemaMismatchError,
    UnsupportedTypeError,
)
from ..formats import Format, Listing, ReadOptions
from ..formats.schemas import check_readable
from ..fs import FileSystemSpec, ListedFile, Paths, hive_partitions, list_files
from .filters import filter_columns

__all__ = ["Prepared", "check_tokens", "list_source", "prepare_source"]

# When a filter does not apply to the first file, how many others to probe for schema drift.
_DRIFT_PROBE_FILES = 64


@dataclass(frozen=True)
class Prepared:
    """A source as rank 0 found it before any file's metadata is planned (picklable: it goes
    to every rank, which plans a share of its files, `steps`).

    Attributes:
        path: the source as given.
        listing: the listed files, in canonical order, with their hive partitions.
        read_options: what the format plans with.
        wanted: the columns batches carry (all: ``None`` until the plan says).
        needed: the filter's columns.
        partition_schema: the hive keys' schema.
        filters: the row filter.
        partitioning: ``"hive"``, or ``None``.
        counting: what planning also counts (``tokens``, ``eos``, ``lengths``).
    """

    path: Paths
    listing: Listing
    read_options: ReadOptions
    wanted: list[str] | None
    needed: tuple[str, ...]
    partition_schema: pa.Schema
    filters: Any
    partitioning: str | None
    counting: dict[str, Any]

    @property
    def counts_by_reading(self) -> bool:
        """Whether planning reads data to count (a filter's rows, tokens, lengths)."""
        counting = self.counting
        return self.filters is not None or bool(counting["tokens"] or counting["lengths"])


def list_source(path: Paths, fmt: Format, fs: FileSystemSpec) -> list[ListedFile]:
    """``path``'s files of ``fmt`` (its companions left out), in canonical order.

    Raises:
        InvalidSourceError: it lists companions only (and `fs.list_files`' errors).
    """
    files = [f for f in list_files(path, fs) if not fmt.companion(f.path)]
    if not files:
        raise InvalidSourceError(f"{path!r} lists no {fmt.name} files, only their companions")
    return files


def prepare_source(
    path: Paths,
    files: list[ListedFile],
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

    ``tokens``: a list column whose values in each chunk's rows are counted (a packed
    dataset's), with one more for each document that is not null when ``eos``.
    ``lengths``: a list column whose every row's length is kept (a token budget's index).

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
        listing=Listing.of(files, partitions),
        read_options=read_options,
        wanted=wanted if columns is not None else None,
        needed=needed,
        partition_schema=partition_schema,
        filters=filters,
        partitioning=partitioning,
        counting={"tokens": tokens, "eos": eos, "lengths": lengths},
    )


def _filter_columns(
    fmt: Format,
    fs: FileSystemSpec,
    *,
    filters: Any,
    available: pa.Schema,
    files: Sequence[ListedFile],
    partition_schema: pa.Schema,
) -> tuple[str, ...]:
    """The columns ``filters`` reads, checked against the first file (and, where it lacks
    one, against others: the message then says the files disagree)."""
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
