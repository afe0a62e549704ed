"""Apache Iceberg tables read by name (the ``iceberg`` extra: pyiceberg): the table layer
(catalog, snapshots, scan, projection by field id, its format) that a table source plans with.

Importing this package imports no pyiceberg, and no dataset: the dataset over a table is
`torch_dataloader_utils.IcebergDataset` (in `dataset/`). The package root also hands it here,
as ``torch_dataloader_utils.iceberg.IcebergDataset``, the name earlier versions exported.
"""

from .errors import MissingDependencyError, UnsupportedTableError

__all__ = ["MissingDependencyError", "UnsupportedTableError"]
