"""A Delta table's log, read through deltalake (delta-rs): the table found, its version resolved
(the latest, a version number, or the version current at a time) and pinned, its protocol
checked against the reader features this library reads.

deltalake replays the log (checkpoints, commits, log compaction) and answers for the pinned
version; it is imported here only, when a table is opened.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any

from ..errors import (
    InvalidArgumentError,
    MissingDependencyError,
    StorageError,
    StorageNotFoundError,
    UnsupportedTableError,
)
from ..fs import FileSystemSpec
from ..sources.tables import VersionSelector
from . import INSTALL_HINT
from .storage import delta_storage_options, table_uri

if TYPE_CHECKING:
    from deltalake import DeltaTable

__all__ = ["READER_FEATURES", "PinnedLog", "log_versions", "open_log", "require_deltalake"]

# Reader features whose data this library reads as the protocol says: deletion vectors and
# column mapping it applies; timestamps without zone, checkpoint forms and vacuum protection
# deltalake resolves; widened types are cast to the table's.
READER_FEATURES = frozenset(
    {
        "deletionVectors",
        "columnMapping",
        "timestampNtz",
        "v2Checkpoint",
        "vacuumProtocolCheck",
        "typeWidening",
        "typeWidening-preview",
    }
)
_MAX_READER_VERSION = 3
_COMMIT = re.compile(r"^(\d{20})\.json$")
_UNSUPPORTED = re.compile(r"Feature '([^']+)' is not supported")


def require_deltalake() -> Any:
    """The deltalake module.

    Raises:
        MissingDependencyError: it is not installed; the message names the pip extra.
    """
    try:
        import deltalake
    except ImportError as exc:
        raise MissingDependencyError(
            f"reading Delta tables needs deltalake, which is not installed: {INSTALL_HINT}"
        ) from exc
    return deltalake


@dataclass(frozen=True)
class PinnedLog:
    """A table's log at the version read.

    Attributes:
        table: deltalake's table at that version.
        root: the table's location without protocol (on the dataset's storage).
        uri: the location as deltalake opened it.
        version: the version read.
    """

    table: DeltaTable
    root: str
    uri: str
    version: int


def log_versions(root: str, fs: FileSystemSpec) -> list[int]:
    """The versions with a commit file in the table's ``_delta_log`` (sorted; ``[]`` when it
    cannot be listed)."""
    try:
        names = fs.fsspec().ls(f"{root}/_delta_log", detail=False)
    except (OSError, ValueError):
        return []
    found = (_COMMIT.match(str(n).rsplit("/", 1)[-1]) for n in names)
    return sorted(int(m.group(1)) for m in found if m)


def _spans(versions: list[int]) -> str:
    """``[0, 1, 2, 5]`` as ``"0..2, 5"``."""
    spans: list[list[int]] = []
    for v in versions:
        if spans and v == spans[-1][1] + 1:
            spans[-1][1] = v
        else:
            spans.append([v, v])
    return ", ".join(str(a) if a == b else f"{a}..{b}" for a, b in spans) or "none listed"


def _instant(as_of: datetime | int) -> datetime:
    """``as_of`` as an aware datetime (naive: local time, as ``datetime.timestamp`` takes it;
    an int: epoch milliseconds)."""
    if isinstance(as_of, datetime):
        return as_of if as_of.tzinfo is not None else as_of.astimezone()
    if isinstance(as_of, int) and not isinstance(as_of, bool):
        return datetime.fromtimestamp(as_of / 1000, tz=timezone.utc)
    raise InvalidArgumentError(
        f"as_of={as_of!r}: pass a datetime, an ISO 8601 string or epoch milliseconds"
    )


def _version(asked: int | str, label: str) -> int:
    try:
        version = int(asked)
    except (TypeError, ValueError):
        version = -1
    if isinstance(asked, bool) or version < 0:
        raise InvalidArgumentError(f"{label}: version={asked!r} is not a Delta version number")
    return version


def _loaded(deltalake: Any, uri: str, options: dict[str, str], label: str, **kw: Any) -> Any:
    """deltalake's table, its errors as ours."""
    try:
        return deltalake.DeltaTable(uri, storage_options=options or None, **kw)
    except deltalake.exceptions.TableNotFoundError as exc:
        raise StorageNotFoundError(f"{label}: no Delta table there ({exc})") from exc
    except deltalake.exceptions.DeltaError as exc:
        found = _UNSUPPORTED.search(str(exc))
        if found:
            raise UnsupportedTableError(_unsupported(label, found.group(1))) from exc
        if "version" in kw:
            raise  # (the caller names the versions there are)
        raise StorageError(f"{label}: deltalake cannot read the log: {exc}") from exc


def _unsupported(label: str, feature: str, *, deltalake_reads: bool = False) -> str:
    other = (
        "deltalake's DeltaTable(...).scan() reads it"
        if deltalake_reads
        else "deltalake cannot read it either: read it with a Delta reader that supports it"
    )
    return (
        f"{label} needs the reader feature {feature!r}, which this library does not read "
        f"(it reads {sorted(READER_FEATURES)}); {other}"
    )


def check_protocol(table: DeltaTable, label: str) -> None:
    """Refuse a table whose protocol needs what this library does not read.

    Raises:
        UnsupportedTableError: a reader version over 3 or an unknown reader feature (named).
    """
    protocol = table.protocol()
    if protocol.min_reader_version > _MAX_READER_VERSION:
        raise UnsupportedTableError(
            f"{label} needs Delta reader version {protocol.min_reader_version}; this library "
            f"reads up to {_MAX_READER_VERSION}"
        )
    unknown = sorted(set(protocol.reader_features or ()) - READER_FEATURES)
    if unknown:
        raise UnsupportedTableError(_unsupported(label, ", ".join(unknown), deltalake_reads=True))


def open_log(location: str, fs: FileSystemSpec, asked: VersionSelector, label: str) -> PinnedLog:
    """Open the table at ``location`` at the version ``asked`` selects (the latest by default).

    Raises:
        StorageNotFoundError: no Delta table at ``location``.
        InvalidArgumentError: a ``ref`` or ``since`` (Delta has neither), both a version and a
            time, a version the log does not have (the message lists those it has), a time
            before the first commit.
        UnsupportedTableError: a reader feature this library does not read.
        MissingDependencyError: deltalake is not installed.
    """
    deltalake = require_deltalake()
    if asked.ref is not None or asked.since is not None:
        raise InvalidArgumentError(
            f"{label}: Delta tables have no branches, tags or incremental reads; select a "
            "version with version= or as_of="
        )
    if asked.version is not None and asked.as_of is not None:
        raise InvalidArgumentError(f"{label}: pass version= or as_of=, not both")
    uri, root = table_uri(location, fs), fs.strip(location).rstrip("/")
    options = delta_storage_options(fs)
    if not deltalake.DeltaTable.is_deltatable(uri, storage_options=options or None):
        raise StorageNotFoundError(
            f"{label}: no Delta table at {fs.url(root)} (no commit in its _delta_log)"
        )
    if asked.version is not None:
        version = _version(asked.version, label)
        try:
            table = _loaded(deltalake, uri, options, label, version=version)
        except deltalake.exceptions.DeltaError as exc:
            raise InvalidArgumentError(
                f"{label} has no version {version}; its versions: {_spans(log_versions(root, fs))}"
            ) from exc
    else:
        table = _loaded(deltalake, uri, options, label)
        if asked.as_of is not None:
            instant = _instant(asked.as_of)
            _check_after_first_commit(root, fs, instant, label)
            table.load_as_version(instant)
    check_protocol(table, label)
    return PinnedLog(table, root, uri, int(table.version()))


def _check_after_first_commit(root: str, fs: FileSystemSpec, instant: datetime, label: str) -> None:
    """Refuse a time before the first commit (deltalake would read the first version)."""
    versions = log_versions(root, fs)
    if not versions:
        return
    try:
        info = fs.info(f"{root}/_delta_log/{versions[0]:020d}.json")
    except OSError:  # (a StorageError too)
        return
    mtime = info.get("mtime") or info.get("LastModified") or info.get("created")
    if isinstance(mtime, datetime):
        first = mtime if mtime.tzinfo else mtime.replace(tzinfo=timezone.utc)
    elif isinstance(mtime, int | float):
        first = datetime.fromtimestamp(mtime, tz=timezone.utc)
    else:
        return
    if instant < first:
        raise InvalidArgumentError(
            f"{label}: as_of={instant.isoformat()} is before its first commit (version "
            f"{versions[0]}, {first.isoformat()})"
        )
