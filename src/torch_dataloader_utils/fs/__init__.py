"""Filesystem layer: a picklable filesystem spec, deterministic listing, hive partitions."""

from .errors import translate_os_error
from .forks import ProcessLocal
from .hive import hive_partitions
from .listing import ListedFile, Paths, SourceFile, list_files
from .retry import RetryCounter, RetryPolicy, is_transient, retrying
from .spec import STORAGE_BACKENDS, FileSystemSpec, StorageBackend, StorageOptions

__all__ = [
    "Paths",
    "STORAGE_BACKENDS",
    "FileSystemSpec",
    "ListedFile",
    "ProcessLocal",
    "RetryCounter",
    "RetryPolicy",
    "SourceFile",
    "StorageBackend",
    "StorageOptions",
    "hive_partitions",
    "is_transient",
    "list_files",
    "retrying",
    "translate_os_error",
]
