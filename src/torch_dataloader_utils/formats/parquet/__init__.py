"""Apache Parquet: `ParquetFormat` (`format`: reading), planned from footers walked by our own
Thrift reader (`footer`, `thrift`) into the facts planning keeps (`facts`, `planning`); columns
with no leaves (`leafless`) and repeated or empty names (`renaming`) read as pyarrow's reference
reads them."""

from __future__ import annotations

from .format import ParquetFormat

__all__ = ["ParquetFormat"]
