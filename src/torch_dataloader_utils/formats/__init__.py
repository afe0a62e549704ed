"""Formats: one plug-in point (`Format`), a registry of built-ins by name."""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Mapping
from typing import Any

from ..errors import InvalidArgumentError, UnknownFormatError
from .base import Format, FormatPlan, ReadOptions

__all__ = ["Format", "FormatPlan", "ReadOptions", "available_formats", "get_format"]

# Lazy registry (fsspec's habit): name -> "module:Class", imported on first use, so importing the
# package imports no format's optional dependency.
_REGISTRY: dict[str, str] = {
    "csv": "torch_dataloader_utils.formats.text_csv:CsvFormat",
    "ipc": "torch_dataloader_utils.formats.ipc:IpcFormat",
    "json": "torch_dataloader_utils.formats.text_json:JsonFormat",
    "orc": "torch_dataloader_utils.formats.orc:OrcFormat",
    "parquet": "torch_dataloader_utils.formats.parquet:ParquetFormat",
    "webdataset": "torch_dataloader_utils.formats.webdataset:WebDatasetFormat",
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


def available_formats() -> list[str]:
    """Names of the registered formats."""
    return sorted(_REGISTRY)


def get_format(name: str | Format, options: Mapping[str, Any] | None = None) -> Format:
    """The format registered under ``name``, built with ``options`` (a `Format` instance passes
    through).

    Args:
        name: a format name or alias (``"parquet"``, ``"csv"``, ``"tar"``, ...) or a `Format`.
        options: keyword arguments of the format's class (``CsvFormat(delimiter=";")``, ...).

    Raises:
        UnknownFormatError: no format has that name.
        InvalidArgumentError: ``options`` with a `Format` instance, or options the format does
            not take.
    """
    if isinstance(name, Format):
        if options:
            raise InvalidArgumentError(
                f"format_options {sorted(options)} go with a format name; a {type(name).__name__} "
                "instance is already configured"
            )
        return name
    key = _ALIASES.get(str(name).lower(), str(name).lower())
    if key not in _REGISTRY:
        hint = (
            "; Iceberg tables are read by name with IcebergDataset.create_dataloader(table=..., "
            "catalog_config=...)"
            if key == "iceberg"
            else ""
        )
        raise UnknownFormatError(
            f"unknown format {name!r}; available formats: {', '.join(available_formats())}{hint}"
        )
    module, _, cls_name = _REGISTRY[key].partition(":")
    cls = getattr(importlib.import_module(module), cls_name)
    options = dict(options or {})
    try:
        inspect.signature(cls).bind(**options)
    except TypeError as exc:  # an unknown option; a TypeError inside __init__ stays one
        raise InvalidArgumentError(f"format {key!r} does not take format_options: {exc}") from exc
    fmt: Format = cls(**options)
    return fmt
