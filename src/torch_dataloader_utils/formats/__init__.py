"""Formats: one plug-in point (`Format`), a registry of built-ins by name."""

from __future__ import annotations

import importlib

from ..errors import UnknownFormatError
from .base import Format, FormatPlan, ReadOptions

__all__ = ["Format", "FormatPlan", "ReadOptions", "available_formats", "get_format"]

# Lazy registry (fsspec's habit): name -> "module:Class", imported on first use, so importing the
# package imports no format's optional dependency.
_REGISTRY: dict[str, str] = {
    "parquet": "torch_dataloader_utils.formats.parquet:ParquetFormat",
}
_ALIASES: dict[str, str] = {"pq": "parquet"}


def available_formats() -> list[str]:
    """Names of the registered formats."""
    return sorted(_REGISTRY)


def get_format(name: str | Format) -> Format:
    """The format registered under ``name`` (a `Format` instance passes through).

    Raises:
        UnknownFormatError: no format has that name.
    """
    if isinstance(name, Format):
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
    module, _, cls = _REGISTRY[key].partition(":")
    fmt: Format = getattr(importlib.import_module(module), cls)()
    return fmt
