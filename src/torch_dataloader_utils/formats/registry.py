"""The format registry: names to ``"module:Class"`` targets, imported on first use.

As fsspec does for filesystems: the built-in formats, formats registered at run time with
`register_format`, and formats that installed packages declare in the entry-point group
``torch_dataloader_utils.formats``. Nothing is imported until a format is asked for by name,
so importing the package imports no format's optional dependency, and installed plug-ins are
read only when a name is not otherwise known (or `available_formats` lists them).
"""

from __future__ import annotations

import functools
import importlib
import threading
import warnings
from collections.abc import Mapping
from importlib.metadata import entry_points
from typing import Any

from ..errors import (
    InvalidArgumentError,
    MissingDependencyError,
    TorchDataloaderUtilsWarning,
    UnknownFormatError,
)
from ..errors.keywords import check_keywords, keywords_of
from .base import Format

__all__ = ["ENTRY_POINT_GROUP", "available_formats", "get_format", "register_format"]

ENTRY_POINT_GROUP = "torch_dataloader_utils.formats"

# name -> "module:Class" (or a class registered as such).
_REGISTRY: dict[str, str | type[Format]] = {
    "csv": "torch_dataloader_utils.formats.text:CsvFormat",
    "ipc": "torch_dataloader_utils.formats.ipc:IpcFormat",
    "json": "torch_dataloader_utils.formats.text:JsonFormat",
    "orc": "torch_dataloader_utils.formats.orc:OrcFormat",
    "parquet": "torch_dataloader_utils.formats.parquet:ParquetFormat",
    "webdataset": "torch_dataloader_utils.webdataset.format:WebDatasetFormat",
}
_ALIASES: dict[str, str] = {
    "pq": "parquet",
    "arrow": "ipc",
    "feather": "ipc",
    "jsonl": "json",
    "ndjson": "json",
    "tar": "webdataset",
    "wds": "webdataset",
}
_lock = threading.Lock()
_entry_points_read = False


def register_format(name: str, target: str | type[Format], *, clobber: bool = False) -> None:
    """Register a `Format` class under ``name``, for ``format=name`` and `get_format`.

    Registering imports nothing: a ``"module:Class"`` target is imported when the format is
    first asked for. Installed packages can register theirs without being imported, in the
    entry-point group ``torch_dataloader_utils.formats`` (see the formats reference).

    Args:
        name: the format's name (case-insensitive).
        target: ``"module:Class"`` (``Class`` may be dotted), or the class itself.
        clobber: replace the format registered under ``name`` (a built-in one too).
            Registering the same target again is allowed without it.

    Raises:
        InvalidArgumentError: ``name`` is empty, ``target`` is not ``"module:Class"`` nor a
            `Format` subclass, or ``name`` is taken by another format and ``clobber`` is false.

    Example:
        >>> import torch_dataloader_utils as tdu
        >>> tdu.register_format("parquet-no-crc", "torch_dataloader_utils:ParquetFormat")
        >>> tdu.get_format("parquet-no-crc", {"verify_checksums": False}).name
        'parquet'
    """
    if not isinstance(name, str) or not name.strip():
        raise InvalidArgumentError(
            f"register_format: the name must be a non-empty str, got {name!r}"
        )
    key = _key(name)
    if isinstance(target, str):
        module, _, attribute = target.partition(":")
        if not module or not attribute or ":" in attribute:
            raise InvalidArgumentError(
                f"register_format({name!r}, {target!r}): the target must be 'module:Class'"
            )
    elif not (isinstance(target, type) and issubclass(target, Format)):
        raise InvalidArgumentError(
            f"register_format({name!r}, ...): the target must be 'module:Class' or a Format "
            f"subclass, got {target!r}"
        )
    _read_entry_points()  # so that an installed plug-in's name is taken whatever the order
    with _lock:
        taken = _REGISTRY.get(_ALIASES.get(key, key))
        if taken is not None and taken != target and not clobber:
            raise InvalidArgumentError(
                f"format {key!r} is registered already (as {_describe(taken)}); pass "
                "clobber=True to replace it"
            )
        _ALIASES.pop(key, None)
        _REGISTRY[key] = target


def available_formats() -> list[str]:
    """Names of the registered formats (installed plug-ins included)."""
    _read_entry_points()
    return sorted(_REGISTRY)


def get_format(name: str | Format, options: Mapping[str, Any] | None = None) -> Format:
    """The format registered under ``name``, built with ``options`` (a `Format` instance passes
    through).

    Args:
        name: a format name or alias (``"parquet"``, ``"csv"``, ``"tar"``, ...) or a `Format`.
        options: keyword arguments of the format's class (``CsvFormat(delimiter=";")``, ...).

    Raises:
        UnknownFormatError: no format has that name, or its registered class cannot be
            imported.
        InvalidArgumentError: ``options`` with a `Format` instance.
        UnknownKeywordError: an option the format does not take (names every option it takes,
            and the closest to the one given).
    """
    if isinstance(name, Format):
        if options:
            raise InvalidArgumentError(
                f"format_options {sorted(options)} go with a format name; a {type(name).__name__} "
                "instance is already configured"
            )
        return name
    cls = _format_class(_key(str(name)), name)
    options = dict(options or {})
    accepted, anything = keywords_of(cls)
    if not anything:  # a TypeError inside __init__ stays one
        refusal = f"format {_key(str(name))!r} does not take format_options"
        check_keywords(options, accepted, refusal=refusal, list_accepted=True)
    fmt: Format = cls(**options)
    return fmt


def _key(name: str) -> str:
    return name.lower()


def _describe(target: str | type[Format]) -> str:
    return repr(target) if isinstance(target, str) else f"{target.__module__}:{target.__qualname__}"


def _lookup(key: str) -> str | type[Format] | None:
    key = _ALIASES.get(key, key)
    found = _REGISTRY.get(key)
    if found is None:
        _read_entry_points()
        found = _REGISTRY.get(key)
    return found


def _format_class(key: str, name: object) -> type[Format]:
    target = _lookup(key)
    if target is None:
        hint = (
            "; Iceberg tables are read by name with IcebergDataset.create_dataloader(table=..., "
            "catalog_config=...)"
            if key == "iceberg"
            else ""
        )
        raise UnknownFormatError(
            f"unknown format {name!r}; available formats: {', '.join(available_formats())}{hint}"
        )
    if not isinstance(target, str):
        return target
    module, _, attribute = target.partition(":")
    try:
        cls: object = importlib.import_module(module)
        cls = functools.reduce(getattr, attribute.split("."), cls)
    except MissingDependencyError:
        raise  # ours: it names the extra to install
    except (ImportError, AttributeError) as exc:
        raise UnknownFormatError(
            f"format {key!r} is registered as {target!r}, which cannot be loaded: {exc}"
        ) from exc
    if not (isinstance(cls, type) and issubclass(cls, Format)):
        raise UnknownFormatError(
            f"format {key!r} is registered as {target!r}, which is not a Format subclass"
        )
    return cls


def _read_entry_points() -> None:
    """Register the formats installed packages declare (once; names taken are kept)."""
    global _entry_points_read
    with _lock:
        if _entry_points_read:
            return
        for point in entry_points(group=ENTRY_POINT_GROUP):
            key = _key(point.name)
            taken = _REGISTRY.get(_ALIASES.get(key, key))
            if taken is None:
                _REGISTRY[key] = point.value
            elif taken != point.value:
                warnings.warn(  # the user's to fix (uninstall or rename a plug-in)
                    f"the format {point.name!r} of entry point {point.value!r} is ignored: "
                    f"the name is registered already (as {_describe(taken)})",
                    TorchDataloaderUtilsWarning,
                    stacklevel=2,
                )
        _entry_points_read = True
