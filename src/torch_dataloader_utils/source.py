"""A source of a mixture (`Source`): files or an Iceberg table, its weight, and the options
`create_dataloader` takes for one source; it plans itself by building that source's dataset."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from .dataset import StructuredDataset
from .errors import InvalidArgumentError
from .formats import Format
from .fs import RetryPolicy, StorageBackend, StorageOptions
from .fs import Source as Paths

__all__ = ["SOURCE_DEFAULTS", "Source", "with_defaults"]


@dataclass(frozen=True)
class Source:
    """One source of a mixture: files (``path``) or an Iceberg table (``table``), its weight,
    and the options `create_dataloader` takes for one source.

    Args:
        path: a path or URL, a directory, a glob, a brace pattern, or a list of them.
        format: the format of the files (``"parquet"``, ``"webdataset"``, ...).
        table: an Iceberg table name (``"db.table"``), read through ``catalog_config``.
        weight: the source's share of each epoch's rows, relative to the other sources'
            (default: 1 when another source has a weight; when none has, the sources share
            the epoch in proportion to their rows).
        name: a name for messages (default: the path or table).
        columns, filters, storage_options, format_options, partitioning, split_bytes,
            split_rows, storage_backend, retries: as for one source.
        catalog_config, snapshot_id, as_of, ref: the Iceberg table's catalog and snapshot.

    Examples:
        >>> import torch_dataloader_utils as tdu  # doctest: +SKIP
        >>> loader = tdu.create_dataloader(
        ...     [tdu.Source("web/", weight=3), tdu.Source("code/", weight=1)],
        ...     epoch_rows=1_000_000, batch_size=1024, shuffle=True)
    """

    path: Paths | None = None
    format: str | Format = "parquet"
    table: str | None = None
    weight: float | None = None
    name: str | None = None
    columns: Sequence[str] | None = None
    filters: Any = None
    storage_options: StorageOptions | None = None
    format_options: Mapping[str, Any] | None = None
    partitioning: str | None = None
    split_bytes: int | None = None
    split_rows: int | None = None
    storage_backend: StorageBackend = "auto"
    retries: RetryPolicy | int | None = None
    catalog_config: Mapping[str, Any] | None = field(default=None, repr=False)
    snapshot_id: int | None = None
    as_of: Any = None
    ref: str | None = None

    def __post_init__(self) -> None:
        if (self.path is None) == (self.table is None):
            raise InvalidArgumentError("a Source reads either path= (files) or table= (Iceberg)")
        if self.weight is not None and not (self.weight >= 0):
            raise InvalidArgumentError(f"a Source's weight must be >= 0, got {self.weight}")

    @property
    def label(self) -> str:
        """The source's name in messages."""
        if self.name:
            return self.name
        if self.table is not None:
            return self.table
        path = self.path
        if isinstance(path, str | os.PathLike):
            return os.fspath(path)
        return ", ".join(os.fspath(p) for p in path or ())

    def dataset(self, **options: Any) -> StructuredDataset:
        """The one-source dataset that plans this source (``options``: the shared ones)."""
        mine = {
            "columns": self.columns,
            "filters": self.filters,
            "storage_options": self.storage_options,
            "format_options": self.format_options,
            "split_bytes": self.split_bytes,
            "split_rows": self.split_rows,
            "storage_backend": self.storage_backend,
            "retries": self.retries,
        }
        if self.table is not None:
            from .iceberg import IcebergDataset

            return IcebergDataset(
                self.table,
                catalog_config=self.catalog_config,
                snapshot_id=self.snapshot_id,
                as_of=self.as_of,
                ref=self.ref,
                **mine,
                **options,
            )
        assert self.path is not None
        return StructuredDataset(
            self.path, self.format, partitioning=self.partitioning, **mine, **options
        )


# Options create_dataloader may give for every source of a mixture (each Source's own win).
SOURCE_DEFAULTS = (
    "columns",
    "filters",
    "storage_options",
    "format_options",
    "partitioning",
    "split_bytes",
    "split_rows",
    "retries",
    "catalog_config",
)


def with_defaults(source: Source, defaults: Mapping[str, Any]) -> Source:
    """``source`` with the options it leaves unset taken from ``defaults``."""
    unset = {k: v for k, v in defaults.items() if getattr(source, k) is None}
    return dataclasses.replace(source, **unset) if unset else source
