"""Finishing a source's plan (`Planned`) from its format's: the rows a filter passes, tokens
and lengths counted by reading, the decoded size of a row measured.

Everything here reads storage; `steps` says on which ranks (rank 0, or each a share of the
chunks). The source was prepared before (`prepare`); the pure steps of planning live in
`planning/`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from ..formats import Format, FormatPlan, ReadOptions
from ..formats.partitions import with_partition
from ..formats.schemas import check_readable
from ..fs import FileSystemSpec
from ..fs.hub_listing import commit_details
from ..planning import Chunk, Chunks, Plan
from ..tokenizing import Derivation
from ..tokenizing.derive import TOKEN_TYPE
from .census import Census, census_counts
from .counting import count_lengths, count_rows, count_tokens, tokens_of_lengths
from .prepare import Prepared

__all__ = [
    "Counts",
    "Planned",
    "count_chunks",
    "decoded_row_bytes",
    "derived_schema",
    "finish_source",
]

# Rows read at plan time to measure the decoded size of a row: at most this many, and about
# `_SAMPLE_BYTES` of them by the plan's estimate (the footers' encoded sizes).
_SAMPLE_ROWS = 1024
_SAMPLE_BYTES = 4 << 20
# Rows at least this wide by the plan's estimate are not sampled: decoding one row decodes its whole
# page, and wide values are stored plain, so their estimate is their decoded size
# (docs/adr/0020-measurements-behind-constants.md#the-row-size-sample).
_WIDE_ROW_BYTES = 64 << 10


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


# What `count_chunks` counts: each chunk's rows that pass, its tokens, its rows' lengths.
Counts = tuple[list[int] | None, list[int] | None, list[np.ndarray] | None]


def count_chunks(
    prepared: Prepared,
    planned: FormatPlan,
    fmt: Format,
    fs: FileSystemSpec,
    chunks: Sequence[int] | None = None,
    *,
    census: Census | None = None,
) -> Counts:
    """What planning counts by reading, of each of the plan's ``chunks`` (indexes; all by
    default): the rows that pass the filter, the tokens (a packed dataset's), every row's
    length (a token budget's), each ``None`` where not asked; from the ``census`` of a source
    that computes from its rows."""
    read_options = _final(prepared, planned)
    needed = [c for c in prepared.needed if c not in prepared.partition_schema.names]
    counting = prepared.counting
    tokens, lengths = counting["tokens"], counting["lengths"]
    picked: Sequence[Chunk] = planned.chunks
    told = planned.token_counts
    if chunks is not None:
        picked = [planned.chunks[i] for i in chunks]
        told = None if told is None else [told[i] for i in chunks]
    if census is not None and prepared.counts_by_reading:
        return census_counts(
            picked,
            fmt,
            fs,
            read_options,
            census,
            identities=prepared.listing.identities,
            tokens=tokens,
            eos=bool(counting["eos"]),
            lengths=lengths,
            rows=prepared.filters is not None or prepared.transformed,
            label=str(prepared.path),
        )

    def reading(*column: str) -> ReadOptions:
        return dataclasses.replace(read_options, columns=tuple(dict.fromkeys([*column, *needed])))

    rows = None
    if prepared.filters is not None:
        # Count the rows that pass, reading only the filter's columns: equal batch counts
        # per rank and resuming at a batch need them (docs/concepts/model.md).
        rows = count_rows(picked, fmt, fs, reading())
    each = None
    if lengths is not None:
        # A token budget's batches (or a balanced packing's costs) are made from every row's
        # length, before any stream.
        each = count_lengths(picked, fmt, fs, reading(lengths), lengths)
    counted = None
    if tokens is not None and tokens == lengths:  # (the lengths hold the tokens: no new read)
        assert each is not None
        counted = tokens_of_lengths(each, eos=bool(counting["eos"]))
    elif tokens is not None:
        # A packed dataset's order is one of tokens: each chunk's, exact, before any stream.
        counted = count_tokens(
            picked, fmt, fs, reading(tokens), tokens, eos=counting["eos"], told=told
        )
    return rows, counted, each


def _final(prepared: Prepared, planned: FormatPlan) -> ReadOptions:
    """The read options with what the plan learned; the token column is planning's."""
    return dataclasses.replace(planned.read_options or prepared.read_options, tokens=None)


def finish_source(
    prepared: Prepared,
    planned: FormatPlan,
    fmt: Format,
    fs: FileSystemSpec,
    counts: Counts | None = None,
    *,
    census: Census | None = None,
) -> Planned:
    """The source's plan from its format's: the rows a filter passes, tokens and lengths
    counted (``counts``, when counted already: `count_chunks`, else now, by ``census`` for a
    source that computes from its rows), a row's decoded size measured.

    Raises:
        SchemaMismatchError: the columns read are not readable together.
    """
    p = prepared
    read_options = _final(p, planned)
    partition_schema = p.partition_schema
    # All columns (none asked): the plan's, which may be more than the first file's
    # (WebDataset shards with other extensions).
    wanted = p.wanted or [*planned.schema.names, *partition_schema.names]
    if counts is None:
        counts = count_chunks(p, planned, fmt, fs, census=census)
    rows, tokens, lengths = counts
    filtered_rows = None if rows is None else tuple(rows)
    chunk_tokens = None if tokens is None else tuple(tokens)
    row_lengths = None
    if lengths is not None:
        row_lengths = np.concatenate(lengths) if lengths else np.zeros(0, np.int32)
    schema = pa.schema(list(planned.schema) + list(partition_schema))
    check_readable(schema, str(p.path))
    derive = None if census is None else census.derive
    if derive is not None:
        schema, wanted = derived_schema(
            schema, wanted, derive, chunks=planned.chunks, read_options=read_options, fmt=fmt, fs=fs
        )
    plan = Plan(
        chunks=Chunks.of(planned.chunks),
        schema=pa.schema([schema.field(c) for c in wanted]),
        row_bytes=planned.row_bytes,
        details=Plan.details_of(
            format=fmt.name,
            columns=wanted,
            filter=p.filters,
            hive=p.partitioning,
            # (Hub files: the commit they were listed at)
            **commit_details(fs.protocol, (f.path for f in p.listing.files)),
            **({} if derive is None else derive.identity),
        ),
        filtered_rows=filtered_rows,
        files=p.listing.identities,
    )
    return Planned(
        read_options=read_options,
        plan=plan,
        output_columns=tuple(wanted) if p.needed or p.wanted is not None else None,
        decoded_row_bytes=decoded_row_bytes(
            plan.chunks, plan.row_bytes, read_options, fmt, fs, derive=derive
        ),
        chunk_tokens=chunk_tokens,
        row_lengths=row_lengths,
    )


def derived_schema(
    schema: pa.Schema,
    wanted: list[str],
    derive: Derivation,
    *,
    chunks: Sequence[Chunk],
    read_options: ReadOptions,
    fmt: Format,
    fs: FileSystemSpec,
) -> tuple[pa.Schema, list[str]]:
    """The schema of the rows ``derive`` yields from ``schema``'s, and the columns batches
    carry: a transform's columns are a sample's (the first rows of the first chunk with rows,
    transformed), and the token column is added (nothing is tokenized: a planning from the
    kept census tokenizes nothing)."""
    if derive.counts_rows:
        sample = _sample(chunks, _SAMPLE_ROWS, read_options, fmt=fmt, fs=fs, derive=derive)
        schema = sample[0].schema if sample else schema
        wanted = list(schema.names)
    output = derive.output
    if output is None:
        return schema, wanted
    fields = [f for f in schema if f.name != output]
    carried = wanted if output in wanted else [*wanted, output]
    return pa.schema([*fields, pa.field(output, TOKEN_TYPE)]), carried


def decoded_row_bytes(
    chunks: Sequence[Chunk],
    row_bytes: float,
    read_options: ReadOptions,
    fmt: Format,
    fs: FileSystemSpec,
    *,
    derive: Derivation | None = None,
) -> float:
    """Decoded bytes per row, measured on the first rows of the first non-empty chunk (after
    ``derive``'s transform; its tokens estimated, as many bytes as their text: about four
    bytes of text a token, four bytes an id).

    The footers' uncompressed sizes (``row_bytes`` per row) are encoded sizes:
    dictionary-encoded strings can be 100x smaller there than in memory, which would make
    "64 MiB" blocks gigabytes. The sample is about `_SAMPLE_BYTES` (rows of at least
    `_WIDE_ROW_BYTES` are not sampled).
    """
    if row_bytes >= _WIDE_ROW_BYTES:
        return row_bytes
    rows = min(_SAMPLE_ROWS, max(1, int(_SAMPLE_BYTES // max(row_bytes, 1e-9))))
    sample = _sample(chunks, rows, read_options, fmt=fmt, fs=fs, derive=derive)
    if not sample:
        return 1.0
    nbytes = sum(int(b.nbytes) for b in sample)
    if derive is not None and derive.tokenize is not None:
        text = derive.tokenize.column
        nbytes += sum(int(b.column(text).nbytes) for b in sample if text in b.schema.names)
    rows = sum(int(b.num_rows) for b in sample)
    return float(nbytes / max(1, rows)) if rows else 1.0


def _sample(
    chunks: Sequence[Chunk],
    rows: int,
    read_options: ReadOptions,
    *,
    fmt: Format,
    fs: FileSystemSpec,
    derive: Derivation | None,
) -> list[pa.RecordBatch]:
    """The first ``rows`` rows of the first non-empty chunk, with partition columns, filtered
    and transformed by ``derive`` (not tokenized); none: every chunk is empty."""
    chunk = next((c for c in chunks if c.num_rows), None)
    if chunk is None:
        return []
    where = f"{fs.url(chunk.path)} (chunk {chunk.start}:{chunk.stop})"
    batches = fmt.read(chunk, 0, min(rows, chunk.num_rows), fs, read_options)
    try:
        sample = [with_partition(b, chunk.partition, read_options) for b in batches]
    finally:
        fmt.close()
    if derive is not None:
        expr = read_options.filter
        sample = [b.filter(expr) if expr is not None else b for b in sample]
        sample = [derive.transformed(b, where) for b in sample]
    return sample
