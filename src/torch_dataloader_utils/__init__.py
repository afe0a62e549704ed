"""torch-dataloader-utils: structured data on object storage and lakehouses into PyTorch.

Every row exactly once per epoch, equal batches on every rank, real row shuffling.

Examples:
    >>> import torch_dataloader_utils as tdu  # doctest: +SKIP
    >>> loader = tdu.create_dataloader("data/", format="parquet", batch_size=1024, shuffle=True)
    >>> for epoch in range(3):
    ...     loader.set_epoch(epoch)
    ...     for batch in loader:
    ...         ...

The public names, by who reads them (``__all__`` holds them sorted):

- Training: `create_dataloader`, `TabularDataLoader`, `StructuredDataset`, `IcebergDataset`,
  `MixtureDataset`, `Source`, `Packing`, `TokenBudget`, `Balance`, `Tokenize`, `Transform`,
  `RetryPolicy`, `CacheStats`, `attention`, `ShardWriter`.
- Format authors: `Format`, `FormatPlan`, `Listing`, `ReadOptions`, `Chunk`, `Plan`,
  `register_format`, `get_format`, `available_formats`, and the formats shipped:
  `ParquetFormat`, `OrcFormat`, `CsvFormat`, `JsonFormat`, `IpcFormat`, `WebDatasetFormat`.
- Tools over the data order: `Piece`, `Topology`, `Converter`.
- Errors and warnings: `TorchDataloaderUtilsError` and its kinds (the names ending in
  ``Error``), `TorchDataloaderUtilsWarning`.
"""

from __future__ import annotations

import logging

from . import attention, iceberg
from .batching import Balance, Packing, TokenBudget
from .cache import CacheStats
from .convert import Converter
from .create import create_dataloader
from .dataset import IcebergDataset, MixtureDataset, StructuredDataset
from .errors import (
    ColumnNotFoundError,
    CorruptFileError,
    DataError,
    FileChangedError,
    FilterTypeError,
    InvalidArgumentError,
    InvalidSourceError,
    MissingComponentError,
    MissingDependencyError,
    NullValueError,
    PlanTimeoutError,
    SchemaMismatchError,
    StateMismatchError,
    StorageError,
    StorageNotFoundError,
    StoragePermissionError,
    TorchDataloaderUtilsError,
    TorchDataloaderUtilsWarning,
    UnknownFormatError,
    UnknownKeywordError,
    UnsupportedFileError,
    UnsupportedTableError,
    UnsupportedTypeError,
    WorkerDiedError,
)
from .formats import (
    Format,
    FormatPlan,
    Listing,
    ReadOptions,
    available_formats,
    get_format,
    register_format,
)
from .formats.ipc import IpcFormat
from .formats.orc import OrcFormat
from .formats.parquet import ParquetFormat
from .formats.text import CsvFormat, JsonFormat
from .fs import RetryPolicy
from .loader import TabularDataLoader
from .options import Source
from .planning import Chunk, Piece, Plan, Topology
from .tokenizing import Tokenize, Transform
from .webdataset import ShardWriter
from .webdataset.format import WebDatasetFormat

__version__ = "0.3.0.dev0"

__all__ = [
    "Balance",
    "CacheStats",
    "Chunk",
    "ColumnNotFoundError",
    "Converter",
    "CorruptFileError",
    "CsvFormat",
    "DataError",
    "FileChangedError",
    "FilterTypeError",
    "Format",
    "FormatPlan",
    "IcebergDataset",
    "InvalidArgumentError",
    "InvalidSourceError",
    "IpcFormat",
    "JsonFormat",
    "Listing",
    "MissingComponentError",
    "MissingDependencyError",
    "MixtureDataset",
    "NullValueError",
    "OrcFormat",
    "Packing",
    "ParquetFormat",
    "Piece",
    "Plan",
    "PlanTimeoutError",
    "ReadOptions",
    "RetryPolicy",
    "SchemaMismatchError",
    "ShardWriter",
    "Source",
    "StateMismatchError",
    "StorageError",
    "StorageNotFoundError",
    "StoragePermissionError",
    "StructuredDataset",
    "TabularDataLoader",
    "TokenBudget",
    "Tokenize",
    "Topology",
    "TorchDataloaderUtilsError",
    "TorchDataloaderUtilsWarning",
    "Transform",
    "UnknownFormatError",
    "UnknownKeywordError",
    "UnsupportedFileError",
    "UnsupportedTableError",
    "UnsupportedTypeError",
    "WebDatasetFormat",
    "WorkerDiedError",
    "__version__",
    "attention",
    "available_formats",
    "create_dataloader",
    "get_format",
    "register_format",
]

if __all__ != sorted(__all__):  # keep the public list curated and sorted
    raise ImportError("torch_dataloader_utils.__all__ must be sorted")

# The name earlier versions exported from the table layer, handed there by the façade: the
# table layer imports no dataset (docs/adr/0029-the-house-third-round.md).
iceberg.IcebergDataset = IcebergDataset  # type: ignore[attr-defined]

logging.getLogger(__name__).addHandler(logging.NullHandler())
