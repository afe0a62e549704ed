"""Errors of Iceberg reads: defined with the rest of the hierarchy, re-exported here."""

from __future__ import annotations

from ..errors import MissingDependencyError, UnsupportedTableError

__all__ = ["INSTALL_HINT", "MissingDependencyError", "UnsupportedTableError"]

INSTALL_HINT = 'pip install "torch-dataloader-utils[iceberg]"'
