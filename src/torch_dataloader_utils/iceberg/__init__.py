"""Apache Iceberg tables read by name (the ``iceberg`` extra: pyiceberg): the table layer
(catalog, snapshots, scan, projection by field id, its format) that a table source plans with.

Importing this package imports no pyiceberg. The dataset over a table is
`torch_dataloader_utils.IcebergDataset` (in `dataset/`); ``torch_dataloader_utils.iceberg.
IcebergDataset`` still names it.
"""

from __future__ import annotations

import importlib
from typing import Any

from .errors import MissingDependencyError, UnsupportedTableError

__all__ = ["IcebergDataset", "MissingDependencyError", "UnsupportedTableError"]


def __getattr__(name: str) -> Any:
    # The name earlier versions exported from here, looked up when asked: the table layer
    # stands below the datasets and imports none of them (docs/adr/0029-the-house-third-round.md).
    if name == "IcebergDataset":
        return importlib.import_module("torch_dataloader_utils.dataset.iceberg").IcebergDataset
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
