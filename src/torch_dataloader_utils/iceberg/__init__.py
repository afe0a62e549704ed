"""Apache Iceberg tables read by name (the ``iceberg`` extra: pyiceberg).

Importing this package imports no pyiceberg; `IcebergDataset` checks for it when built.
"""

from .dataset import IcebergDataset
from .errors import MissingDependencyError, UnsupportedTableError

__all__ = ["IcebergDataset", "MissingDependencyError", "UnsupportedTableError"]
