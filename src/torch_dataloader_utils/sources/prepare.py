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
    InvalidArgumentError,
    InvalidSourceError,
    SchemaMismatchError,
    UnsupportedTypeError,
)
from ..formats import Format, Listing, ReadOptions
from ..formats.schemas import check_readable
from ..fs import FileSystemSpec, ListedFile, Paths, hive_partitions, list_files
from ..tokenizing import Derivation
from ..tokenizing.derive import TOKEN_TYPE
from .filters import filter_columns

__all__ = ["Prepared", "check_derived", "check_tokens", "list_source", "prepare_source"]

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
        transformed: a transform yields its rows (the census counts them).
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
    transformed: bool = False

    @property
    def counts_by_reading(self) -> bool:
        """Whether planning reads data to count (a filter's rows, tokens, lengths, a
        transform's rows)."""
        counting = self.counting
        return (
            self.filters is not None
            or self.transformed
            or bool(counting["tokens"] or counting["lengths"])
        )


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
    derive: Derivation | None = None,
) -> Prepared:
    """The listed ``files`` checked and the read options worked out: one file's schema read.

    ``tokens``: a list column whose values in each chunk's rows are counted (a packed
    dataset's), with one more for each document that is not null when ``eos``.
    ``lengths``: a list column whose every row's length is kept (a token budget's index).
    ``derive``: a transform and tokens computed from the rows (their columns are not read).

    Raises:
        ColumnNotFoundError: a column in ``columns`` or ``filters`` is not in the data.
        SchemaMismatchError: a hive key is a column.
        InvalidArgumentError: a packing's or budget's column is not the tokenized one.
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
    made = check_derived(derive, available, tokens, lengths, fs.url(probe.path))
    if derive is not None and derive.output is not None and not derive.counts_rows:
        available = available.append(pa.field(derive.output, TOKEN_TYPE))
    for name, what in ((tokens, "Packing"), (lengths, "TokenBudget")):
        if name is not None and name not in made:
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
    made_here = () if derive is None or derive.output is None else (derive.output,)
    for name in (tokens, lengths, *made_here):  # packing, budgets, tokens: their column
        if name is not None and name not in wanted:
            wanted.append(name)
    text = () if derive is None or derive.tokenize is None else (derive.tokenize.column,)
    read = [
        c
        for c in dict.fromkeys([*wanted, *text, *needed])
        if c not in partition_schema.names and c not in made
    ]
    if derive is not None and derive.counts_rows:
        # The transform's columns are known once it runs: it reads what was asked, and
        # batches carry what it yields (the plan's schema is a sample's, `files`).
        read = list(dict.fromkeys([*(columns or ()), *needed]))
    read_options = ReadOptions(
        columns=tuple(read) if (columns is not None or needed) and read else None,
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
        wanted=wanted if columns is not None and not (derive and derive.counts_rows) else None,
        needed=needed,
        partition_schema=partition_schema,
        filters=filters,
        partitioning=partitioning,
        counting={"tokens": tokens, "eos": eos, "lengths": lengths},
        transformed=derive is not None and derive.counts_rows,
    )


def check_derived(
    derive: Derivation | None,
    available: pa.Schema,
    tokens: str | None,
    lengths: str | None,
    where: str,
) -> frozenset[str]:
    """The columns ``derive`` makes (not read from the files), checked: a packing's or
    budget's column is the tokenized one, and the text column is in the data (unless a
    transform makes it).

    Raises:
        InvalidArgumentError: a packing's or budget's column is another column.
        ColumnNotFoundError: the text column is not in the data.
    """
    if derive is None or derive.tokenize is None:
        return frozenset()
    tokenize = derive.tokenize
    for name, what in ((tokens, "Packing"), (lengths, "TokenBudget")):
        if name is not None and name != tokenize.output:
            raise InvalidArgumentError(
                f"{what}'s column {name!r} is not the tokenized column {tokenize.output!r} "
                "(Tokenize's output): name it"
            )
    if not derive.counts_rows and tokenize.column not in available.names:
        raise ColumnNotFoundError(
            f"{where}: Tokenize's column {tokenize.column!r} is not a column of the data "
            f"(columns: {available.names})"
        )
    return frozenset({tokenize.output})


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
