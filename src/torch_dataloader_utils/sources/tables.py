"""Table sources: what planning asks of a table, and the values a table kind answers with.

A table (Iceberg, Delta Lake, Lance, Parquet at a Hub commit) is data files under a version. A
table kind answers four questions, through `TableKind.open` and the `PinnedTable` it returns
(docs/adr/0028-table-sources.md):

- which version: resolved once, here at planning, and pinned (`TableVersion`); it goes into the
  plan's fingerprint, so a state saved at one version refuses another;
- which data files, with their row groups' rows and bytes (`TableFile`);
- which rows of each file are deleted: sorted positions (`TableFile.deleted`);
- which logical schema, and how a file's columns are matched to it (`TableSchema`).

It also says where its files are stored (`PinnedTable.storage`) and which `Format` reads its
chunks (`TableKind.format`). Everything below those answers is the same for every kind
(`sources.table_planning`): the columns checked, the live rows counted per row group, row
groups grouped into chunks, rows and tokens counted, the `Planned` built. Deleted rows are
counted there and dropped by the kind's `Format` when it reads (`sources.table_deletes`). A
kind is registered by name in `sources.table_kinds`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from functools import cached_property
from typing import Any, Generic, Literal, Protocol, TypeVar

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ..errors import InvalidArgumentError
from ..formats import Format, FormatPlan, Listing, ReadOptions
from ..fs import FileSystemSpec
from .table_deletes import live_rows

__all__ = [
    "PinnedTable",
    "TableFile",
    "TableFormat",
    "TableReadOptions",
    "TableFilter",
    "TableKind",
    "TableRequest",
    "TableSchema",
    "TableVersion",
    "VersionSelector",
]


# --- what a table kind is asked ---------------------------------------------------------------


@dataclass(frozen=True)
class VersionSelector:
    """Which version of a table to read, as the user asked; each kind resolves it at planning
    and refuses what it does not support.

    Attributes:
        version: a version by its own name: an Iceberg snapshot id, a Delta or Lance version
            number, a Hub commit.
        as_of: the version current at this time: a ``datetime`` or epoch milliseconds.
        ref: a branch or tag (an Iceberg ref, a Hub revision).
        since: an incremental read's exclusive start (Iceberg's ``from_snapshot_id``): only
            rows added after it, up to the version selected by the other fields.
    """

    version: int | str | None = None
    as_of: datetime | int | None = None
    ref: str | None = None
    since: int | str | None = None


@dataclass(frozen=True)
class TableRequest:
    """What a dataset asks of a table: a plain value, the same for every kind.

    Attributes:
        table: the table: a name in a catalog (``"db.events"``, or a sequence of names) or a
            location (a path or URL), as the kind is addressed (`sources.table_kinds`).
        catalog: the catalog's properties (a kind read by name); never stored, logged or shown.
        version: which version to read.
        columns: the columns batches carry (``None``: all).
        filters: the row filter, in a form the kind takes (a ``pyarrow.compute.Expression``;
            Iceberg also takes its own expressions and strings).
        split_bytes, split_rows: the chunk targets (`ReadOptions`).
        tokens, eos: a packed dataset's token-list column, whose values in each chunk's live
            rows that pass the filter are counted (with one more per list that is not null
            when ``eos``).
        lengths: a token budget's list column, whose every live row's length is kept.
    """

    table: str | Sequence[str]
    catalog: Mapping[str, Any] | None = field(default=None, repr=False)
    version: VersionSelector = VersionSelector()
    columns: tuple[str, ...] | None = None
    filters: Any = None
    split_bytes: int | None = None
    split_rows: int | None = None
    tokens: str | None = None
    eos: bool = False
    lengths: str | None = None


# --- what a table kind answers ----------------------------------------------------------------


@dataclass(frozen=True)
class TableVersion:
    """The version a read sees, resolved at planning and pinned in the plan.

    Attributes:
        id: the version's own name (a snapshot id, a Delta version, a Hub commit); ``None``
            when the table has no version yet (nothing to read).
        details: what identifies the table and this version in the plan's fingerprint, under
            the kind's own keys (Iceberg: ``table_uuid``, ``snapshot_id``,
            ``from_snapshot_id``); ``id`` must be among the values. Not ``format``,
            ``columns`` or ``filter``: the plan sets those.
    """

    id: int | str | None
    details: Mapping[str, object]


@dataclass(frozen=True)
class TableSchema:
    """The logical schema of the version read, and how a data file's columns are matched to it.

    Attributes:
        arrow: every top-level column, as batches carry it; the plan's schema is the columns
            read, taken from it.
        matched_by: ``"field_id"``: a file's column is the table's column with its field id (a
            renamed column keeps its id; Iceberg, Delta with column mapping); ``"name"``: by
            name (Delta without column mapping, Lance, Parquet at a Hub commit).
        field_ids: each column's field id, in ``arrow``'s order (``matched_by="field_id"``).
    """

    arrow: pa.Schema
    matched_by: Literal["field_id", "name"] = "name"
    field_ids: tuple[int, ...] = ()


@dataclass(frozen=True)
class TableFilter:
    """The request's row filter as the kind understood it.

    Attributes:
        rows: the filter rows are kept by, applied after the deletes (``None``: none).
        text: the filter in the plan's fingerprint: the same text in every process.
    """

    rows: pc.Expression | None
    text: str

    @classmethod
    def of(cls, filters: Any) -> TableFilter:
        """A pyarrow expression (or ``None``) taken as it is (checked by planning)."""
        return cls(filters, str(filters))


@dataclass(frozen=True)
class TableFile:
    """One data file of the version read, as planning counts it.

    Attributes:
        path: the file without protocol, on `PinnedTable.storage` (the chunks' ``path``).
        size: its size in bytes.
        row_groups: physical rows of each row group (the chunks' units), before deletes.
        row_group_bytes: bytes of each row group in the columns read (an estimate: chunks are
            balanced by it).
        deleted: the deleted rows: sorted, unique file-wide positions (``int64``); positions
            past the file's rows are ignored.
        version: the file's version token for the plan's files (``""``: its size identifies
            it; table files are written once under a unique name).
        info: what the kind's `Format` needs of this file (picklable; gathered into the read
            options by `PinnedTable.read_options`).
    """

    path: str
    size: int
    row_groups: tuple[int, ...]
    row_group_bytes: tuple[int, ...]
    deleted: np.ndarray = field(default_factory=lambda: np.empty(0, np.int64), repr=False)
    version: str = ""
    info: Any = None

    def live(self) -> tuple[int, ...]:
        """Rows of each row group left after the deletes."""
        live, first = [], 0
        for rows in self.row_groups:
            live.append(live_rows(self.deleted, first, first + rows))
            first += rows
        return tuple(live)


class _Planned(Protocol):
    @property
    def path(self) -> str: ...


F = TypeVar("F", bound=_Planned)


@dataclass(frozen=True)
class TableReadOptions(ReadOptions, Generic[F]):
    """The `ReadOptions` a kind's format reads with (`PinnedTable.read_options`): the table,
    for messages, and the facts of each data file of the plan (its ``TableFile.info``), looked
    up by a chunk's path. A kind subclasses it with what else its reads need.

    Attributes:
        table: the table in messages.
        files: each data file's facts (with a ``path``: the chunks' ``path``).
    """

    table: str = ""
    files: tuple[F, ...] = ()

    @cached_property
    def _by_path(self) -> dict[str, F]:
        return {f.path: f for f in self.files}

    def file(self, path: str) -> F:
        """The facts of a chunk's data file.

        Raises:
            InvalidArgumentError: the path is not a data file of this plan.
        """
        try:
            return self._by_path[path]
        except KeyError:
            raise InvalidArgumentError(
                f"{path} is not a data file of the plan of {self.table}"
            ) from None

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state.pop("_by_path", None)  # rebuilt on first use
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)


Opts = TypeVar("Opts", bound=TableReadOptions[Any])


class TableFormat(Format, Generic[Opts]):
    """A table kind's `Format`: its chunks are planned from the table (`TableKind.open`), never
    from a listing of files, and read with the kind's `TableReadOptions` (``options_type``).

    Attributes:
        options_type: the kind's read options.
        planned_from: what plans it, for the refusal of a listing (``"an Iceberg table is
            planned from its catalog"``).
        read_as: how a user reads one (``'create_dataloader(path, format="delta")'``).
    """

    options_type: type[Opts]
    planned_from = "a table is planned from its metadata"
    read_as = 'create_dataloader("<table>", format="<kind>")'

    def plan(self, listing: Listing, fs: FileSystemSpec, options: ReadOptions) -> FormatPlan:
        """Not supported: a table is planned from its metadata.

        Raises:
            InvalidArgumentError: always.
        """
        raise InvalidArgumentError(f"{self.planned_from}, not from a list of files: {self.read_as}")

    def table_options(self, options: ReadOptions) -> Opts:
        """``options`` as the kind's read options, which planning made.

        Raises:
            InvalidArgumentError: they are not (plain `ReadOptions`, not from `plan_table`).
        """
        if not isinstance(options, self.options_type):
            raise InvalidArgumentError(
                f"the {self.name} format reads chunks planned from its table ({self.read_as}), "
                f"with {self.options_type.__name__}; got {type(options).__name__}"
            )
        return options


class PinnedTable(Protocol):
    """A table at the version planning pinned, as `TableKind.open` returns it (planning only:
    never pickled, never sent to other ranks)."""

    @property
    def label(self) -> str:
        """The table in messages (``"Iceberg table db.events"``)."""
        ...

    @property
    def version(self) -> TableVersion:
        """The version read."""
        ...

    @property
    def schema(self) -> TableSchema:
        """The schema rows are read in."""
        ...

    @property
    def storage(self) -> FileSystemSpec | None:
        """Where the data files are: the table's protocol and its own storage options (each
        rank reads under its own options over them); ``None``: the dataset's filesystem."""
        ...

    @property
    def filter(self) -> TableFilter:
        """The request's row filter."""
        ...

    def files(self, columns: tuple[str, ...], fs: FileSystemSpec) -> Sequence[TableFile]:
        """The data files of the version that the filter does not prune, in canonical order,
        with their row groups and deleted positions; ``columns``: the columns read (for the
        bytes), ``fs``: `storage` under the dataset's filesystem."""
        ...

    def read_options(self, options: ReadOptions, files: Sequence[TableFile]) -> ReadOptions:
        """``options`` (columns read, filter, split targets) as the kind's `Format` reads
        ``files``' chunks: a `ReadOptions` subclass with what it needs of them."""
        ...


class TableKind(Protocol):
    """A kind of table (Iceberg, Delta, ...): registered by name in `sources.table_kinds`."""

    @property
    def name(self) -> str:
        """The kind's name: the ``format`` of the plan's fingerprint."""
        ...

    def format(self) -> Format:
        """The `Format` that reads this kind's chunks (every rank and worker reads with its own
        copy); its ``read(chunk, a, b)`` addresses LIVE rows ``[a, b)`` of the chunk."""
        ...

    def open(self, request: TableRequest, fs: FileSystemSpec) -> PinnedTable:
        """Find the table, resolve and pin the version, read its schema, take the filter.

        ``fs``: the dataset's filesystem (a table read by path is found through it).

        Raises:
            StorageNotFoundError: no such table (the message names it).
            InvalidArgumentError: no such version; a request the kind cannot serve.
        """
        ...
