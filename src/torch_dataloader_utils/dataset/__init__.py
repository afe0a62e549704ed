"""The datasets: one body for every dataset (`base`), and its constructors: files with the
earlier library's arguments (`structured`), an Iceberg table (`iceberg`) and a mixture of
sources (`mixture`). How a source is planned is `planning`; the keywords each takes,
`keywords`."""

from .base import Combined, PlannedDataset
from .iceberg import IcebergDataset
from .mixture import MixtureDataset
from .structured import StructuredDataset, loader_over

__all__ = [
    "Combined",
    "IcebergDataset",
    "MixtureDataset",
    "PlannedDataset",
    "StructuredDataset",
    "loader_over",
]
