"""The format plug-in point: ``plan`` (main process, metadata only) and ``read`` (worker)."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, fields
from typing import Any, TypeVar

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ..errors import InvalidArgumentError
from ..fs import FileSystemSpec, ListedFile
from ..planning import Chunk

__all__ = ["Format", "FormatPlan", "Listing", "Partition", "ReadOptions"]

_Options = TypeVar("_Options", bound="ReadOptions")

# A file's hive partition: its ``(key, value)`` pairs, in the partition schema's order.
Partition = tuple[tuple[str, object], ...]


@dataclass(frozen=True)
class Listing:
    """A source's files as listed, in canonical order, each with its hive partition: what a
    format plans (`Format.plan`).

    Attributes:
        files: the files.
        partitions: each file's hive partition (empty tuples without hive partitioning).
    """

    files: tuple[ListedFile, ...]
    partitions: tuple[Partition, ...]

    def __post_init__(self) -> None:
        if len(self.files) != len(self.partitions):
            raise InvalidArgumentError(
                f"a listing of {len(self.files)} files has {len(self.partitions)} partitions"
            )

    @classmethod
    def of(
        cls, files: Sequence[ListedFile], partitions: Sequence[Partition] | None = None
    ) -> Listing:
        """``files`` with their ``partitions`` (``None``: no hive partitioning)."""
        given = tuple(partitions) if partitions is not None else ((),) * len(files)
        return cls(tuple(files), given)

    def __len__(self) -> int:
        return len(self.files)

    def take(self, indexes: Sequence[int]) -> Listing:
        """The files at ``indexes`` (in that order), with their partitions."""
        return Listing(
            tuple(self.files[i] for i in indexes), tuple(self.partitions[i] for i in indexes)
        )

    @property
    def identities(self) -> dict[str, tuple[int, str]]:
        """Each file's size and version, by path: what a plan pins of it."""
        return {f.path: (f.size, f.version) for f in self.files}


@dataclass(frozen=True)
class ReadOptions:
    """What to read, shared by planning and reading.

    Attributes:
        columns: the file columns to read (``None``: all); includes columns the row filter needs.
        filter: the row filter; formats may use it to prune chunks at plan time, the dataset
            applies it to rows.
        split_bytes: target compressed bytes per chunk: consecutive native units (row groups)
            are grouped until the target is reached.
        split_rows: target rows per chunk, likewise; with both, whichever is reached first
            closes the chunk; with neither, a chunk is one native unit.
        partition_schema: hive partition columns, which the filter may reference.
        tokens: planning only (reads ignore it): a packed dataset's token column, whose
            values in each chunk a format may count from its metadata
            (`FormatPlan.token_counts`).
    """

    columns: tuple[str, ...] | None = None
    filter: pc.Expression | None = None
    split_bytes: int | None = None
    split_rows: int | None = None
    partition_schema: pa.Schema | None = None
    tokens: str | None = None

    @classmethod
    def of(cls: type[_Options], options: ReadOptions, **facts: Any) -> _Options:
        """``options`` as this (sub)class, with ``facts``: the fields this class adds (what a
        format's ``plan`` learned for its reads)."""
        given = {f.name for f in fields(options)}
        values = {f.name: getattr(options, f.name) for f in fields(cls) if f.name in given}
        return cls(**{**values, **facts})


@dataclass(frozen=True)
class FormatPlan:
    """What a format's ``plan`` returns.

    Attributes:
        chunks: chunks in canonical order.
        schema: the schema of what ``read`` yields (the projected file columns).
        row_bytes: estimated decoded bytes per row.
        read_options: the options every ``read`` of this plan gets, carrying what planning
            learned that reading needs (a `ReadOptions` subclass of the format's own, built
            from the options ``plan`` was given); ``None``: those options, unchanged.
        token_counts: with ``options.tokens`` and no filter, what the metadata tells of each
            chunk exactly: the values of that list column in its rows (a null list holds
            none) and its lists that are not null (``None`` where only the values are told),
            or ``None`` for a chunk it does not tell (counted by reading). ``None``: nothing
            told.
    """

    chunks: Sequence[Chunk]  # (`Chunks`, columns, where a format builds them so)
    schema: pa.Schema
    row_bytes: float
    read_options: ReadOptions | None = None
    token_counts: Sequence[tuple[int, int | None] | None] | None = None


class Format(ABC):
    """A file format: how to plan a source's files (a `Listing`) into chunks and read a
    chunk's rows.

    Subclasses are stateless and picklable: workers and other ranks read with copies of the
    format as constructed, never the instance that planned. What ``plan`` learns that ``read``
    needs (inferred types, the columns found) goes into the returned `FormatPlan.read_options`,
    a frozen `ReadOptions` subclass of the format's own, which every ``read`` of the plan gets;
    caches of open files or metadata are fine, plan-time facts on ``self`` are not.
    ``read`` must be deterministic: the same chunk and rows give the same batches in the same
    order, which exact resume depends on.
    """

    name: str = ""
    # String columns that name a row's source (WebDataset's ``__url__`` and ``__key__``): read
    # along with decoded columns so that a value that does not decode is named by them.
    sample_columns: tuple[str, ...] = ()

    @abstractmethod
    def schema(self, file: ListedFile, fs: FileSystemSpec) -> pa.Schema:
        """The schema of one file (all its columns), reading metadata only.

        Raises:
            CorruptFileError: the file cannot be parsed.
        """

    # Whether ``plan`` is ``assemble`` over each file's ``facts``: planning may then read the
    # facts on several ranks and keep them for a restart (`sources.steps`, `sources.kept`).
    per_file: bool = False

    def facts(self, listing: Listing, fs: FileSystemSpec, options: ReadOptions) -> list[Any]:
        """What planning reads of each file of ``listing`` (picklable, small), in order; a
        ``per_file`` format's. Errors as `plan`'s."""
        raise NotImplementedError(f"{type(self).__name__} plans its files together")

    def assemble(
        self, listing: Listing, facts: Sequence[Any], fs: FileSystemSpec, options: ReadOptions
    ) -> FormatPlan:
        """The plan of ``listing`` from its files' ``facts`` (read now, or on other ranks, or
        kept from an earlier run); a ``per_file`` format's. Errors as `plan`'s."""
        raise NotImplementedError(f"{type(self).__name__} plans its files together")

    def plan(self, listing: Listing, fs: FileSystemSpec, options: ReadOptions) -> FormatPlan:
        """Plan the files of ``listing`` into chunks, reading metadata only (a ``per_file``
        format's: its ``facts`` of each file, assembled).

        Args:
            listing: the listed files, in canonical order, with their hive partitions.
            fs: the filesystem.
            options: the read options.

        Returns:
            The chunks, their schema, and in ``read_options`` what ``read`` needs to know of
            the plan (left ``None`` when ``options`` say it all).

        Raises:
            CorruptFileError: a file cannot be parsed.
            SchemaMismatchError: files disagree on the columns read.
            ColumnNotFoundError: a requested column is in no file.
        """
        if not self.per_file:
            raise NotImplementedError(f"{type(self).__name__} must plan its files")
        return self.assemble(listing, self.facts(listing, fs, options), fs, options)

    @abstractmethod
    def read(
        self,
        chunk: Chunk,
        row_start: int,
        row_stop: int,
        fs: FileSystemSpec,
        options: ReadOptions,
    ) -> Iterator[pa.RecordBatch]:
        """Yield rows ``[row_start, row_stop)`` of ``chunk`` (before any row filter), in order.

        ``options`` are the plan's (`FormatPlan.read_options`), possibly with other
        ``columns`` (counting a filter reads only its columns).

        Raises:
            CorruptFileError: the chunk's bytes cannot be decoded.
            StorageError: the storage failed.
        """

    def prefetch(  # noqa: B027 - optional hook
        self,
        chunk: Chunk,
        row_start: int,
        row_stop: int,
        fs: FileSystemSpec,
        options: ReadOptions,
    ) -> None:
        """A hint: ``read`` of these rows comes next. Remote formats start fetching their bytes
        (bounded); the default does nothing."""

    def quick_start(self, rows: int) -> None:  # noqa: B027 - optional hook
        """A hint: the first ``rows`` of the next ``read`` are wanted at once (a stream's
        first block, which the first batch waits for): a format may decode them in smaller
        batches. `close` forgets it; the default does nothing."""

    def file_rows(
        self, chunk: Chunk, fs: FileSystemSpec, options: ReadOptions
    ) -> np.ndarray | None:
        """The row number in its file of each of ``chunk``'s rows (before a row filter), for
        `rows_at`; ``None`` (the default) when they are the file's rows from the chunk's first
        unit on, which the plan's counts tell. A table's format answers: its chunks' rows are
        the live rows, which deletes leave gaps between."""
        return None

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release cached handles (open files); called when a stream ends."""

    def companion(self, path: str) -> bool:
        """Whether ``path``, found by listing a directory or a glob, belongs to a data file
        rather than holding data (WebDataset's ``.idx`` index beside a ``.tar`` shard): the
        planner leaves such files out. The default: no file is a companion."""
        return False

    def null_origin(
        self, chunk: Chunk, column: str, fs: FileSystemSpec, options: ReadOptions
    ) -> str:
        """Where the first null of ``column`` in ``chunk`` comes from (``"value 'n/a' at line
        3 ..."``), for an error that refuses nulls; ``""`` when the format cannot say (the
        default: a null is a null in the file)."""
        return ""

    def decoders(self, schema: pa.Schema) -> dict[str, Callable[[Any], Any]]:
        """Per-value decoders of columns of ``schema`` (the plan's), applied in the worker
        after conversion to ``torch``/``numpy``/``dict`` output (see `decoding.Decoding`);
        they must pickle. The default: none."""
        return {}
