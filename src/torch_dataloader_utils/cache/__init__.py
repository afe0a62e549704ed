"""A node-local disk cache of what is read from object storage: byte ranges of the plan's files
and planning metadata, keyed by the identity the plan pinned, shared by every process on the
machine (docs/concepts/cache.md)."""

from .config import CACHE_DIR_VARIABLE, CACHE_LIMIT_VARIABLE, CacheConfig, parse_size
from .files import CachingFileSystem, ReadCache
from .stats import CacheCounter, CacheStats
from .store import CacheSummary, RangeStore, file_key, open_store

__all__ = [
    "CACHE_DIR_VARIABLE",
    "CACHE_LIMIT_VARIABLE",
    "CacheConfig",
    "CacheCounter",
    "CacheStats",
    "CacheSummary",
    "CachingFileSystem",
    "RangeStore",
    "ReadCache",
    "file_key",
    "open_store",
    "parse_size",
]
