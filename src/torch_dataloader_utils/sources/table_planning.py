"""Planning a table from its kind's answers (`sources.tables`): the same for every kind.

The version is pinned when the kind opens the table; then the columns are checked against its
schema, each row group counts its live rows (after the deleted positions), row groups with
live rows are grouped into chunks by `formats.chunking.group_units`, the rows a filter passes,
a packed dataset's tokens and a token budget's lengths are counted through the kind's
`Format`, and the `Planned` is built, whose fingerprint holds the version's details. Runs once
per job (on rank 0 under torch.distributed).
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Sequence

import numpy as np
import pyarrow as pa

from ..errors import ColumnNotFoundError, InvalidArgumentError
from ..formats import Format, ReadOptions
from ..formats.chunking import group_units
from ..fs import FileSystemSpec
from ..planning import Chunk, Chunks, Plan
from ..tokenizing import Derivation
from .census import Census, census_counts
from .counting import count_lengths, count_rows, count_tokens, tokens_of_lengths
from .files import Planned, decoded_row_bytes, derived_schema
from .filters import filter_columns
from .prepare import check_derived, check_tokens
from .tables import PinnedTable, TableFile, TableKind, TableRequest

__all__ = ["plan_table", "table_chunks"]

logger = logging.getLogger(__name__)

# Fingerprint details the plan sets itself: a kind's `TableVersion.details` must not use them.
_PLAN_DETAILS = frozenset({"format", "columns", "filter"})


def plan_table(
    kind: TableKind,
    request: TableRequest,
    fs: FileSystemSpec,
    census: Census | None = None,
) -> Planned:
    """Plan a read of a table: the version pinned, its files' live row groups grouped into
    chunks, rows and tokens counted.

    Args:
        kind: the table's kind.
        request: what to read.
        fs: the dataset's own filesystem, whose storage options (over the table's), backend
            and retries planning reads the table's files with.
        census: a table whose rows the loader transforms or tokenizes: what it computes, and
            where its counts are kept (`sources.census`; taken on this rank alone).

    Returns:
        The plan, with the kind's read options, and as its ``fs`` the table's storage without
        the user's storage options: each rank reads it under its own, which never travel.

    Raises:
        ColumnNotFoundError: a column in ``columns`` or ``filters`` is not in the table.
        UnsupportedTypeError: ``tokens`` or ``lengths`` does not hold lists of integers.
        InvalidArgumentError: the kind's version details clash with the plan's own.
        (and what the kind raises: `TableKind.open`, `PinnedTable.files`)
    """
    table = kind.open(request, fs)
    storage = table.storage
    read_fs = storage.under(fs) if storage is not None else fs
    derive = None if census is None else census.derive
    wanted, needed, read = _columns(table, request, derive)
    files = list(table.files(read, read_fs))
    split = ReadOptions(split_bytes=request.split_bytes, split_rows=request.split_rows)
    chunks = table_chunks(files, split)
    options = table.read_options(
        dataclasses.replace(
            split,
            columns=read if (request.columns is not None or needed) and read else None,
            filter=table.filter.rows,
        ),
        files,
    )
    fmt = kind.format()
    counted = options.filter is not None or request.tokens or request.lengths
    if census is None or not (counted or census.derive.counts_rows):
        filtered_rows, chunk_tokens, row_lengths = _counts(
            chunks, fmt, read_fs, options, request=request, needed=needed
        )
    else:
        filtered_rows, chunk_tokens, row_lengths = _census(
            chunks, fmt, read_fs, options, census, request=request, table=table, files=files
        )
    schema = table.schema.arrow
    if derive is not None:
        schema, wanted = derived_schema(
            schema, wanted, derive, chunks=chunks, read_options=options, fmt=fmt, fs=read_fs
        )
    rows = sum(c.num_rows for c in chunks)
    details = _details(kind, table, wanted)
    if derive is not None:
        details = tuple(sorted((*details, *Plan.details_of(**derive.identity))))
    plan = Plan(
        chunks=Chunks.of(chunks),
        schema=pa.schema([schema.field(c) for c in wanted]),
        row_bytes=max(1.0, sum(c.num_bytes for c in chunks) / max(1, rows)),
        details=details,
        filtered_rows=filtered_rows,
        files={f.path: (f.size, f.version) for f in files},
    )
    logger.info(
        "%s at version %s: %d data files, %d with deleted rows, %d live rows",
        table.label,
        table.version.id,
        len(files),
        sum(1 for f in files if len(f.deleted)),
        rows,
    )
    return Planned(
        read_options=options,
        plan=plan,
        output_columns=tuple(wanted) if needed or request.columns is not None else None,
        decoded_row_bytes=decoded_row_bytes(
            chunks, plan.row_bytes, options, fmt, read_fs, derive=derive
        ),
        fs=storage,
        chunk_tokens=chunk_tokens,
        row_lengths=row_lengths,
    )


def table_chunks(files: Sequence[TableFile], split: ReadOptions) -> list[Chunk]:
    """The chunks of ``files``: each file's row groups with live rows, counted in live rows,
    grouped by `group_units` to about ``split``'s targets (neither: one row group a chunk); a
    row group without live rows is left out, which closes a chunk."""
    chunks: list[Chunk] = []
    for file in files:
        sizes = zip(file.live(), file.row_group_bytes, strict=True)
        units = [(i, rows, nbytes) for i, (rows, nbytes) in enumerate(sizes) if rows]
        chunks.extend(group_units(file.path, units, (), split))
    return chunks


def _columns(
    table: PinnedTable, request: TableRequest, derive: Derivation | None
) -> tuple[list[str], tuple[str, ...], tuple[str, ...]]:
    """The columns batches carry (a packed table's ``tokens``, a token budget's ``lengths``
    among them), those the row filter reads, and those read (what ``derive`` makes is not;
    with a transform, the columns asked and the filter's).

    Raises:
        ColumnNotFoundError: a column is not in the table.
        UnsupportedTypeError: ``tokens`` or ``lengths`` does not hold lists of integers.
        InvalidArgumentError: a packing's or budget's column is not the tokenized one.
    """
    available = table.schema.arrow
    arrow_filter = table.filter.rows
    needed = filter_columns(arrow_filter, available) if arrow_filter is not None else ()
    made = check_derived(derive, available, request.tokens, request.lengths, table.label)
    wanted = list(request.columns) if request.columns is not None else list(available.names)
    output = () if derive is None or derive.output is None else (derive.output,)
    for column, what in ((request.tokens, "Packing"), (request.lengths, "TokenBudget")):
        if column is not None:
            if column not in made:
                check_tokens(available, column, table.label, what)
            if column not in wanted:  # packing and budgets read their column
                wanted.append(column)
    wanted += [c for c in output if c not in wanted]
    if derive is not None and derive.counts_rows:
        # (The transform reads what was asked; its columns are a sample's, `derived_schema`.)
        return wanted, needed, tuple(dict.fromkeys([*(request.columns or ()), *needed]))
    names = available.names
    missing = [c for c in wanted if c not in names and c not in made]
    if missing:
        raise ColumnNotFoundError(
            f"{table.label}: column(s) {missing} not in the table; columns: {names}"
        )
    text = () if derive is None or derive.tokenize is None else (derive.tokenize.column,)
    read = tuple(c for c in dict.fromkeys([*wanted, *text, *needed]) if c not in made)
    return wanted, needed, read


def _details(kind: TableKind, table: PinnedTable, wanted: list[str]) -> tuple[tuple[str, str], ...]:
    """The plan's fingerprint details: the kind, its version's details, the columns and filter.

    Raises:
        InvalidArgumentError: the version's details use a key the plan sets.
    """
    version = dict(table.version.details)
    clash = sorted(_PLAN_DETAILS & version.keys())
    if clash:
        raise InvalidArgumentError(
            f"{table.label}: the {kind.name} table kind's version details use {clash}, which "
            "the plan sets itself"
        )
    return Plan.details_of(format=kind.name, **version, columns=wanted, filter=table.filter.text)


def _census(
    chunks: Sequence[Chunk],
    fmt: Format,
    fs: FileSystemSpec,
    options: ReadOptions,
    census: Census,
    *,
    request: TableRequest,
    table: PinnedTable,
    files: Sequence[TableFile],
) -> tuple[tuple[int, ...] | None, tuple[int, ...] | None, np.ndarray | None]:
    """`_counts` of a table whose rows the loader transforms or tokenizes: from the census."""
    rows, tokens, lengths = census_counts(
        chunks,
        fmt,
        fs,
        options,
        census,
        identities={f.path: (f.size, f.version) for f in files},
        tokens=request.tokens,
        eos=request.eos,
        lengths=request.lengths,
        rows=options.filter is not None or census.derive.counts_rows,
        label=table.label,
    )
    row_lengths = None
    if lengths is not None:
        row_lengths = np.concatenate(lengths) if lengths else np.zeros(0, np.int32)
    return (
        None if rows is None else tuple(rows),
        None if tokens is None else tuple(tokens),
        row_lengths,
    )


def _counts(
    chunks: Sequence[Chunk],
    fmt: Format,
    fs: FileSystemSpec,
    options: ReadOptions,
    *,
    request: TableRequest,
    needed: tuple[str, ...],
) -> tuple[tuple[int, ...] | None, tuple[int, ...] | None, np.ndarray | None]:
    """The live rows of each chunk that pass the row filter (``None`` without one), a packed
    dataset's tokens in them, and a token budget's every row's length (each ``None`` unless
    asked), reading only the columns each count needs."""

    def reading(*column: str) -> ReadOptions:
        return dataclasses.replace(options, columns=tuple(dict.fromkeys([*column, *needed])))

    filtered_rows = chunk_tokens = row_lengths = None
    if options.filter is not None:
        filtered_rows = tuple(count_rows(chunks, fmt, fs, reading()))
    parts = None
    if request.lengths is not None:  # a token budget's (or balance's) index, every live row's
        parts = count_lengths(chunks, fmt, fs, reading(request.lengths), request.lengths)
        row_lengths = np.concatenate(parts) if parts else np.zeros(0, np.int32)
    if request.tokens is not None and parts is not None and request.tokens == request.lengths:
        chunk_tokens = tuple(tokens_of_lengths(parts, eos=request.eos))  # (no second read)
    elif request.tokens is not None:
        counted = count_tokens(
            chunks, fmt, fs, reading(request.tokens), request.tokens, eos=request.eos
        )
        chunk_tokens = tuple(counted)
    return filtered_rows, chunk_tokens, row_lengths
