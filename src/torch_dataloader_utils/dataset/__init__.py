"""The datasets: one body for every dataset (`base`), and the dataset of files with the
earlier library's arguments (`structured`); `IcebergDataset` and `MixtureDataset` build on it."""

from .base import Combined, PlannedDataset
from .structured import StructuredDataset, loader_over

__all__ = ["Combined", "PlannedDataset", "StructuredDataset", "loader_over"]
