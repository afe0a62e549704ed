"""Opening a Lance dataset and resolving the version a read asks for.

Planning opens the latest version to list the versions there are, resolves the one asked for
(a version number, a tag, the latest at or before ``as_of``, or the latest) and opens it; the
workers open that pinned version again themselves (`format`). pylance's errors are translated
into the library's, naming the dataset.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Mapping, Sequence
from datetime import datetime, timedelta, timezone
from typing import TYPE_CHECKING, Any

from ..errors import (
    InvalidArgumentError,
    MissingDependencyError,
    StorageError,
    StorageNotFoundError,
)
from ..fs import FileSystemSpec
from ..sources.tables import VersionSelector

if TYPE_CHECKING:
    from lance import LanceDataset

__all__ = [
    "INSTALL_HINT",
    "dataset_uri",
    "open_dataset",
    "require_lance",
    "resolve_version",
]

INSTALL_HINT = 'pip install "torch-dataloader-utils[lance]"'

# Versions a message lists at most (first and last halves): a dataset may have thousands.
_LISTED = 20
_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)


def require_lance() -> None:
    """Check that pylance is installed, before any work is done.

    Raises:
        MissingDependencyError: it is not; the message names the pip extra.
    """
    try:
        found = importlib.util.find_spec("lance") is not None
    except ValueError:  # a module set to None in sys.modules (how tests hide it)
        found = False
    if not found:
        raise MissingDependencyError(
            f"reading Lance datasets needs pylance, which is not installed: {INSTALL_HINT}"
        )


def dataset_uri(table: str, fs: FileSystemSpec) -> str:
    """The URI pylance opens ``table`` at: an absolute local path, or the URL with its
    protocol."""
    if fs.is_local:
        return fs.strip(table)
    return fs.url(fs.strip(table))


def open_dataset(
    uri: str,
    version: int | str | None,
    label: str,
    storage_options: dict[str, str] | None = None,
) -> LanceDataset:
    """The dataset at ``uri`` at ``version`` (``None``: the latest), opened with pylance's
    ``storage_options`` (`storage.lance_storage_options`).

    Raises:
        StorageNotFoundError: no dataset at ``uri``.
        InvalidArgumentError: no such version or tag.
        StorageError: pylance failed otherwise.
    """
    import lance  # (absolute: pylance, not this package)

    try:
        return lance.dataset(uri, version=version, storage_options=storage_options)
    except (ValueError, OSError) as exc:
        text = str(exc).split(", /")[0]  # (pylance appends its Rust source locations)
        if version is not None and ("Ref not found" in text or ".manifest" in text):
            raise InvalidArgumentError(f"{label} has no version {version!r}: {text}") from exc
        if "not found" in text.lower():
            raise StorageNotFoundError(
                f"{label}: no Lance dataset at {uri} (its _versions folder is missing); check "
                f"the path: {text}"
            ) from exc
        raise StorageError(f"{label}: cannot open the Lance dataset at {uri}: {text}") from exc


def _micros(moment: datetime | int) -> int:
    """Epoch microseconds of a ``datetime`` (naive: local time, as ``datetime.timestamp``
    takes it, and as pylance gives version times) or of epoch milliseconds."""
    if isinstance(moment, datetime):
        aware = moment if moment.tzinfo is not None else moment.astimezone()
        return (aware - _EPOCH) // timedelta(microseconds=1)
    return int(moment) * 1000


def _listed(numbers: Sequence[int]) -> str:
    if len(numbers) <= _LISTED:
        return ", ".join(map(str, numbers))
    half = _LISTED // 2
    head, tail = numbers[:half], numbers[-half:]
    return f"{', '.join(map(str, head))}, ... ({len(numbers)} in all), {', '.join(map(str, tail))}"


def _as_of(versions: Sequence[Mapping[str, Any]], as_of: datetime | int, label: str) -> int:
    """The latest version committed at or before ``as_of``.

    Raises:
        InvalidArgumentError: ``as_of`` is of another type, or before every version.
    """
    if isinstance(as_of, bool) or not isinstance(as_of, datetime | int):
        raise InvalidArgumentError(
            f"{label}: as_of must be a datetime, an ISO 8601 string or epoch milliseconds, got "
            f"{as_of!r}"
        )
    cut = _micros(as_of)
    found = [v["version"] for v in versions if _micros(v["timestamp"]) <= cut]
    if not found:
        first = min(versions, key=lambda v: v["version"])
        raise InvalidArgumentError(
            f"{label} has no version at or before as_of={as_of!r}; its first version "
            f"({first['version']}) is from {first['timestamp'].astimezone().isoformat()}; "
            f"versions: {_listed(sorted(v['version'] for v in versions))}"
        )
    return int(max(found))


def resolve_version(latest: LanceDataset, asked: VersionSelector, label: str) -> int | str:
    """The version ``asked`` selects of the dataset whose latest version is ``latest``: a
    version number, or a tag (opened by name, pinned by its number).

    Raises:
        InvalidArgumentError: ``since``, or more than one of ``version``, ``as_of`` and
            ``ref``; no such version; ``as_of`` before every version.
    """
    if asked.since is not None:
        raise InvalidArgumentError(
            f"{label}: Lance datasets are not read incrementally; since={asked.since!r} is not "
            "supported (read a version with version= or as_of=)"
        )
    given = [n for n in ("version", "as_of", "ref") if getattr(asked, n) is not None]
    if len(given) > 1:
        raise InvalidArgumentError(
            f"{label}: pass at most one of version, as_of and ref (a tag), got {given}"
        )
    if asked.ref is not None:
        return asked.ref  # a tag: pylance resolves it when opened
    version = asked.version
    if version is None and asked.as_of is None:
        return int(latest.version)
    versions = latest.versions()
    numbers = sorted(int(v["version"]) for v in versions)
    if asked.as_of is not None:
        return _as_of(versions, asked.as_of, label)
    if isinstance(version, str) and not version.strip().isdigit():
        return version  # a tag
    if isinstance(version, bool) or not isinstance(version, int | str):
        raise InvalidArgumentError(f"{label}: version must be an int or a tag, got {version!r}")
    number = int(version)
    if number not in numbers:
        raise InvalidArgumentError(
            f"{label} has no version {number}; its versions: {_listed(numbers)}"
        )
    return number
