"""A `Source` that names a table: which table kind reads it, and planning it through the table
registry (`sources.table_kinds`) into the `Planned` every dataset combines.

The rule (`table_kind_of`): ``table=`` names a table in a catalog, of the kind its ``format``
names when that is a table kind read by name, else Iceberg (the one catalog kind built in);
``path=`` with a ``format`` that names a table kind read by path (``Source("s3://b/t",
format="delta")``) names the table at that path; any other source is files.
"""

from __future__ import annotations

import os
from datetime import datetime
from typing import Any

from ..errors import InvalidArgumentError
from ..formats import Format
from ..fs import FileSystemSpec
from ..options import Source
from ..sources.census import Census
from ..sources.files import Planned
from ..sources.table_kinds import table_entry, table_kind
from ..sources.table_planning import plan_table as plan
from ..sources.tables import TableRequest, VersionSelector

__all__ = ["CATALOG_KIND", "plan_table", "table_format", "table_kind_of", "table_request"]

# The kind of a table named by ``table=`` whose ``format`` names no table kind.
CATALOG_KIND = "iceberg"


def table_kind_of(source: Source) -> str | None:
    """The table kind ``source`` names (``None``: it reads files).

    Raises:
        InvalidArgumentError: ``table=`` with the ``format`` of a kind read by path.
    """
    entry = table_entry(source.format) if isinstance(source.format, str) else None
    if source.table is not None:
        if entry is None:
            return CATALOG_KIND
        if entry.address != "name":
            raise InvalidArgumentError(
                f'{entry.name} tables are read by path: Source("<table location>", '
                f'format="{entry.name}"), not table={source.table!r}'
            )
        return entry.name
    if entry is not None and entry.address == "path":
        return entry.name
    return None


def table_request(
    source: Source,
    *,
    tokens: str | None = None,
    eos: bool = False,
    lengths: str | None = None,
) -> TableRequest:
    """What planning asks of ``source``'s table (a table source: `table_kind_of`).

    Raises:
        InvalidArgumentError: a table read by path given more than one path.
    """
    table = source.table
    if table is None:
        path = source.path
        if not isinstance(path, str | os.PathLike):
            raise InvalidArgumentError(f"a table is read from one location, got path={path!r}")
        table = os.fspath(path)
    return TableRequest(
        table,
        catalog=source.catalog_config,
        version=VersionSelector(
            version=source.version if source.version is not None else source.snapshot_id,
            as_of=_instant(source.as_of),
            ref=source.ref,
            since=source.from_snapshot_id,
        ),
        columns=None if source.columns is None else tuple(source.columns),
        filters=source.filters,
        split_bytes=source.split_bytes,
        split_rows=source.split_rows,
        tokens=tokens,
        eos=eos,
        lengths=lengths,
    )


def _instant(as_of: Any) -> Any:
    """``as_of`` as a ``datetime`` when given as an ISO 8601 string (``"...Z"`` is UTC)."""
    if not isinstance(as_of, str):
        return as_of
    text = as_of.strip()
    try:
        return datetime.fromisoformat(text[:-1] + "+00:00" if text.endswith("Z") else text)
    except ValueError:
        raise InvalidArgumentError(
            f'as_of={as_of!r} is not an ISO 8601 time (e.g. "2026-11-01T00:00:00Z"); a '
            "datetime or epoch milliseconds are taken too"
        ) from None


def _kind(source: Source) -> str:
    kind = table_kind_of(source)
    if kind is None:
        raise InvalidArgumentError(f"{source.label!r} is read as files, not as a table")
    return kind


def table_format(source: Source) -> Format:
    """The format ``source``'s table is read with.

    Raises:
        InvalidArgumentError: ``source`` names no table.
        MissingDependencyError: the kind's library is not installed (Iceberg: pyiceberg).
    """
    return table_kind(_kind(source)).format()


def plan_table(
    source: Source,
    fs: FileSystemSpec,
    *,
    tokens: str | None = None,
    eos: bool = False,
    lengths: str | None = None,
    census: Census | None = None,
) -> Planned:
    """Open ``source``'s table, resolve and pin its version, plan its files
    (`sources.table_planning.plan_table`); the plan's ``fs`` is the table's storage, which this
    rank's own storage options, backend and retries (``fs``) apply over. ``tokens``, ``eos``: a
    packed dataset's token column; ``lengths``: a token budget's; counted as files' are
    (``census``: by the census, for a table the loader transforms or tokenizes).

    Raises:
        InvalidArgumentError: ``source`` names no table; and as `sources.table_planning.plan_table`.
    """
    kind = table_kind(_kind(source))
    request = table_request(source, tokens=tokens, eos=eos, lengths=lengths)
    return plan(kind, request, fs, census)
