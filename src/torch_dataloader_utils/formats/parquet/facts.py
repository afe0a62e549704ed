"""What planning reads of a Parquet file: the footer, the row groups kept, and the byte ranges
of the column chunks a read needs."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, NamedTuple

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from ...errors import CorruptFileError, SchemaMismatchError
from ...fs import FileSystemSpec, ListedFile
from ..base import ReadOptions
from ..magic import refuse_other_format
from ..names import unique_schema
from ..opening import open_input, open_to_read_at, parsing
from .footer import MAGIC, Footer, footer_file, native_fragment, parse_footer, read_footer
from .leafless import check_empty_structs, leaf_count, unreadable_columns
from .tokens import TokenLeaf, Told, row_group_tokens, token_leaf

if TYPE_CHECKING:
    import pyarrow.dataset as ds

__all__ = ["FileFacts", "chunk_ranges", "leaf_owners", "read_facts"]


@dataclass(frozen=True)
class FileFacts:
    """What planning keeps of one file: its schema and the row groups it reads.

    ``schema`` has unique column names (`names`); ``renamed`` holds the file's own names when
    they repeat or are empty (``None`` when the schema's are the file's). ``tokens``: with
    ``ReadOptions.tokens`` and no filter, each kept row group's tokens and documents where the
    footer tells them (`tokens.row_group_tokens`).
    """

    schema: pa.Schema
    row_groups: list[tuple[int, int, int, int]]  # (id, rows, compressed, uncompressed) kept
    renamed: tuple[str, ...] | None = None
    tokens: tuple[Told | None, ...] | None = None


def _partition_expression(partition: tuple[tuple[str, object], ...]) -> pc.Expression:
    expr = pc.scalar(True)
    for key, value in partition:
        expr = expr & (pc.field(key).is_null() if value is None else pc.field(key) == value)
    return expr


def read_facts(
    f: ListedFile,
    partition: tuple[tuple[str, object], ...],
    fs: FileSystemSpec,
    options: ReadOptions,
    *,
    native: pafs.FileSystem | None = None,
) -> FileFacts:
    """Read ``f``'s footer (checked), and keep the row groups the row filter may match, with
    the compressed and uncompressed bytes of the columns read; and, without a filter, the
    tokens of ``options.tokens`` in each where the footer tells them (`tokens`).

    The footer is read once and walked once (`footer`); pyarrow parses it only to turn
    a schema not seen before into an Arrow schema (`_arrow_schema`), and, with a row filter,
    to prune row groups by their statistics. ``native``: ``fs``'s `FileSystemSpec.native_reads`,
    to read the footer through pyarrow's C++ reader (`_native_footer`).

    Raises:
        CorruptFileError: the footer cannot be parsed, or disagrees with the schema.
        SchemaMismatchError: the row filter does not apply to this file's columns.
        UnsupportedFileError: a column read holds an empty struct beside other fields
            (`leafless`).
    """
    url = fs.url(f.path)
    if f.size == 0:
        raise CorruptFileError(f"{url}: the file is empty (0 bytes), not a Parquet file")
    filtered = options.filter is not None

    def footer() -> tuple[Footer, _Schema, ds.ParquetFileFragment | None]:
        read = None if native is None else _native_footer(f, partition, native, filtered)
        if read is not None:
            thrift, fragment = read
            with parsing(url):
                checked = parse_footer(thrift, url, f.size)
                schema = _arrow_schema(checked, thrift)
            return checked, schema, fragment if schema.renamed is None else None
        if not filtered:  # only the footer's bytes are wanted (a local file: read cheaper)
            with open_to_read_at(f.path, fs) as source, parsing(url):
                checked, thrift, _ = read_footer(source, source.size(), url)
                return checked, _arrow_schema(checked, thrift), None
        with open_input(f.path, fs) as source, parsing(url):
            size = source.size()
            checked, thrift, start = read_footer(source, size, url)
            schema = _arrow_schema(checked, thrift)
            # pyarrow's dataset binds the filter to the file's names, which a renamed file
            # repeats: its row groups are not pruned (its rows are still filtered when read).
            if schema.renamed is not None:
                return checked, schema, None
            # pyarrow parses the footer again for the statistics: remote, from the bytes
            # already read (no second request); local, from the file.
            parsed = source if fs.is_local else footer_file(source, size, start, thrift)
            # (Imported here: pyarrow.dataset imports pandas, 0.2-0.4 s, which a process that
            # never plans with a filter, such as the CLI's or a worker's, never needs.)
            import pyarrow.dataset as ds

            fragment = ds.ParquetFileFormat().make_fragment(
                parsed, partition_expression=_partition_expression(partition)
            )
            fragment.ensure_complete_metadata()
            return checked, schema, fragment

    try:
        checked, facts, fragment = fs.request(footer, what=url)
    except CorruptFileError as exc:  # say so when it is another format
        refuse_other_format(f, fs, "Parquet", exc)
        raise
    schema, owners, renamed = facts.schema, facts.owners, facts.renamed
    if facts.unreadable:
        check_empty_structs(facts.unreadable, schema, options.columns, url)
    leaf = None if options.tokens is None or filtered else facts.token_leaf(options.tokens)
    kept: set[int] | None = None
    if fragment is not None:
        full = schema
        for field in options.partition_schema or []:
            full = full.append(field)
        try:
            subset = fragment.subset(filter=options.filter, schema=full)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError) as exc:
            # The bytes parsed; the filter does not bind to this file's columns: schema drift.
            raise SchemaMismatchError(
                f"{url}: filters {options.filter} do not apply to this file's schema ({exc}); "
                "other files of the source have different column types"
            ) from exc
        kept = {rg.id for rg in subset.row_groups}
    if options.columns is None:
        leaves = None
    else:
        wanted = set(options.columns)
        leaves = [j for j, owner in enumerate(owners) if owner in wanted]
    row_groups = []
    told: list[Told | None] = []
    for i, (rows, chunks) in enumerate(checked.row_groups):
        if kept is not None and i not in kept:
            continue
        if len(chunks) != len(owners):
            raise CorruptFileError(
                f"{url}: row group {i} has {len(chunks)} column chunks, the schema "
                f"{len(owners)} leaf columns"
            )
        columns = chunks if leaves is None else [chunks[j] for j in leaves]
        compressed = uncompressed = 0
        for c in columns:
            compressed += c.compressed
            uncompressed += c.uncompressed
        row_groups.append((i, rows, compressed, uncompressed))
        if leaf is not None:
            told.append(row_group_tokens(leaf, rows, chunks[leaf.index], checked.thrift))
    return FileFacts(schema, row_groups, renamed, None if leaf is None else tuple(told))


def _native_footer(
    f: ListedFile,
    partition: tuple[tuple[str, object], ...],
    native: pafs.FileSystem,
    filtered: bool,
) -> tuple[bytes, ds.ParquetFileFragment | None] | None:
    """``f``'s footer bytes (Thrift) read by pyarrow's C++ reader (`footer.native_fragment`),
    and with a row filter the fragment that prunes its row groups; None where pyarrow fails.
    pyarrow writes back the footer it parsed, byte for byte for the files it writes; the walk
    goes on from those bytes."""
    where = _partition_expression(partition) if filtered else None
    fragment = native_fragment(f.path, f.size, native, where)
    if fragment is None:
        return None
    sink = pa.BufferOutputStream()
    try:
        fragment.metadata.write_metadata_file(sink)
    except (pa.ArrowException, OSError):
        return None
    written = sink.getvalue().to_pybytes()  # MAGIC, the footer, its length, MAGIC
    return written[len(MAGIC) : -8], fragment if filtered else None


class _Schema(NamedTuple):
    """A file's Arrow schema under unique names (`names`), the top-level column of each of its
    leaf columns, its columns pyarrow cannot read (`leafless.unreadable_columns`), all by those
    names, the file's own names when they differ (None when they do not), its writer, and the
    token leaves asked for so far (`token_leaf`)."""

    schema: pa.Schema
    owners: list[str]
    unreadable: dict[str, str]
    renamed: tuple[str, ...] | None
    created_by: str | None
    leaves: dict[str, TokenLeaf | None]

    def token_leaf(self, column: str) -> TokenLeaf | None:
        """`tokens.token_leaf` of ``column``, worked out once per schema."""
        if column not in self.leaves:
            self.leaves[column] = token_leaf(self.schema, self.owners, column, self.created_by)
        return self.leaves[column]


# Arrow schemas by the footer bytes they come from (`Footer.rest`): the files of a source
# usually share one. Bounded: a source whose footers differ in their metadata (a writer that
# stamps each file) parses each, as before this cache existed.
_SCHEMAS: dict[tuple[bytes, ...], _Schema] = {}
_SCHEMAS_KEPT = 256


def _arrow_schema(footer: Footer, thrift: bytes) -> _Schema:
    """The Arrow schema of the footer ``thrift`` (parsed by pyarrow, once per distinct
    schema and metadata) under unique names, its leaf columns' owners, its columns pyarrow
    cannot read, and the file's own names when they repeat or are empty."""
    found = _SCHEMAS.get(footer.rest)
    if found is not None:
        return found
    # pyarrow reads a footer from a buffer holding only it (the row groups' offsets are not
    # followed).
    tail = pa.BufferReader(thrift + len(thrift).to_bytes(4, "little") + MAGIC)
    metadata = pq.read_metadata(tail)
    stored = metadata.schema.to_arrow_schema()
    schema = unique_schema(stored)
    renamed = None if schema is stored else tuple(stored.names)
    owners = leaf_owners(schema)
    found = _Schema(schema, owners, unreadable_columns(schema), renamed, metadata.created_by, {})
    if len(_SCHEMAS) >= _SCHEMAS_KEPT:
        _SCHEMAS.clear()
    _SCHEMAS[footer.rest] = found
    return found


def leaf_owners(schema: pa.Schema) -> list[str]:
    """The top-level column of each Parquet leaf column, in leaf order.

    Names are matched through the schema's structure, not by splitting the dotted leaf paths,
    which breaks for column names that contain a dot.
    """
    return [field.name for field in schema for _ in range(leaf_count(field.type))]


def chunk_ranges(
    metadata: pq.FileMetaData, footer: Footer, rg: int, columns: Sequence[str] | None
) -> list[tuple[int, int]]:
    """Byte ranges ``(offset, size)`` of row group ``rg``'s column chunks of ``columns``."""
    owners = leaf_owners(metadata.schema.to_arrow_schema())
    wanted = set(columns) if columns is not None else None
    chunks = footer.row_groups[rg][1]
    return [
        (chunks[j].start, chunks[j].compressed)
        for j, owner in enumerate(owners)
        if wanted is None or owner in wanted
    ]
