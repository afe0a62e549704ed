"""The cache a dataset hands to its readers and its planning (`cache.files.ReadCache`): remote
reads of the files it is given go through the node-local cache, local ones stay as they are."""

from __future__ import annotations

import pickle
from pathlib import Path

from torch_dataloader_utils.cache import CacheConfig, CacheCounter, CachingFileSystem, ReadCache
from torch_dataloader_utils.fs import FileSystemSpec

FILES = {"/bucket/a.parquet": (100, "ETag=1"), "/bucket/b.parquet": (50, "")}


def test_local_storage_is_read_as_it_is(tmp_path: Path) -> None:
    local = FileSystemSpec("file")
    cache = ReadCache(CacheConfig(str(tmp_path)), CacheCounter())
    assert cache.wrap(local, FILES, trusted=True) is local


def test_remote_reads_of_the_files_given_go_through_the_cache(tmp_path: Path) -> None:
    remote = FileSystemSpec("memory")
    config, counter = CacheConfig(str(tmp_path)), CacheCounter()
    wrapped = ReadCache(config, counter).wrap(remote, FILES)
    assert isinstance(wrapped, CachingFileSystem)
    assert wrapped.config is config and wrapped.counter is counter
    assert wrapped.key("/bucket/a.parquet") is not None
    assert wrapped.key("/bucket/b.parquet") is None  # no version: read uncached
    assert wrapped.key("/bucket/elsewhere.parquet") is None  # not given: read uncached
    immutable = ReadCache(config, counter).wrap(remote, FILES, immutable=True)
    assert isinstance(immutable, CachingFileSystem)
    assert immutable.key("/bucket/b.parquet") is not None  # its size alone names it


def test_a_read_cache_pickles(tmp_path: Path) -> None:
    cache = ReadCache(CacheConfig(str(tmp_path)), CacheCounter())
    copy = pickle.loads(pickle.dumps(cache))
    assert copy.config == cache.config
    assert isinstance(copy.wrap(FileSystemSpec("memory"), FILES), CachingFileSystem)


def test_pyarrow_never_reads_past_the_cache(tmp_path: Path) -> None:
    """A footer read by pyarrow's own reader (`FileSystemSpec.native_reads`) would not be
    cached: through the cache, planning reads bytes as they are."""
    remote = FileSystemSpec("s3", {"key": "AK", "secret": "SK", "region_name": "us-east-1"})
    assert remote.native_reads() is not None
    wrapped = ReadCache(CacheConfig(str(tmp_path)), CacheCounter()).wrap(remote, FILES)
    assert wrapped.native_reads() is None
