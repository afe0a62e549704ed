"""Filesystem layer: a picklable filesystem spec, deterministic listing, hive partitions."""

from .errors import translate_os_error
from .hive import hive_partitions
from .listing import Source, SourceFile, list_files
from .spec import FileSystemSpec

__all__ = [
    "FileSystemSpec",
    "Source",
    "SourceFile",
    "hive_partitions",
    "list_files",
    "translate_os_error",
]
