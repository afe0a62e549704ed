"""Remote storage read through the node-local cache: a `FileSystemSpec` whose reads of the
plan's files are served from disk when held, and stored there when read.

Every byte a format reads from object storage passes through ``read_range`` or
``open_input`` (a file whose reads are range reads), so the cache sits here, under every
format, keyed by the identity the plan pinned for each file. A hit makes no request at all:
not even the identity check, because the entry's key is that identity, checked against the
store when the entry was written (once per file and process, before its first download). A
loader whose cache holds everything therefore reads an epoch with the store unreachable.
"""

from __future__ import annotations

import functools
import os
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.fs as pafs

from ..fs.forks import ProcessLocal
from ..fs.identity import Identity, check_identity
from ..fs.ranges import RangeFile
from ..fs.spec import FileSystemSpec
from .config import CacheConfig
from .stats import CacheCounter
from .store import RangeStore, file_key

__all__ = ["CachingFileSystem", "ReadCache"]


@dataclass(frozen=True, eq=False)
class ReadCache:
    """A dataset's node-local cache, as its readers and its planning use it: which filesystem
    reads a source's files (`wrap`).

    Attributes:
        config: the cache directory and limit.
        counter: where every read through it is counted (the dataset's `CacheStats`).
    """

    config: CacheConfig
    counter: CacheCounter

    def wrap(
        self,
        fs: FileSystemSpec,
        files: Mapping[str, Identity],
        *,
        trusted: bool = False,
        immutable: bool = False,
    ) -> FileSystemSpec:
        """``fs`` with its reads of ``files`` (their pinned identities) through the cache;
        local storage as it is (see `CachingFileSystem` for ``trusted`` and ``immutable``)."""
        if fs.is_local:
            return fs
        return CachingFileSystem(
            fs, self.config, self.counter, files, immutable=immutable, trusted=trusted
        )


class CachingFileSystem(FileSystemSpec):
    """``inner``'s storage, its reads of ``files`` cached in ``config``'s directory.

    Args:
        inner: the storage (its clients, retry policy and counters are shared).
        config: the cache directory and limit.
        counter: where hits, misses and bytes are counted.
        files: each file's pinned identity (size, version); files not in it, and files whose
            identity has no version token (unless ``immutable``), are read uncached.
        immutable: the source never rewrites a file under the same name (an Iceberg table's
            data files): its size alone identifies it.
        trusted: the identities were just reported by the store (a listing while planning):
            downloads need not check them again.
    """

    def __init__(
        self,
        inner: FileSystemSpec,
        config: CacheConfig,
        counter: CacheCounter,
        files: Mapping[str, Identity],
        *,
        immutable: bool = False,
        trusted: bool = False,
    ) -> None:
        self.__dict__.update(inner.__dict__)  # the same storage, clients and counters
        self._inner = inner
        self.config = config
        self.counter = counter
        self._files = files
        self._immutable = immutable
        self._trusted = trusted
        # (Built from the config, not a bound method: no cycle keeps a dropped reader's handle,
        # and its lock files, open until the garbage collector runs.)
        self._store: ProcessLocal[RangeStore] = ProcessLocal(
            functools.partial(RangeStore, config, counter)
        )
        self._keys: dict[str, str | None] = {}
        self._checked: set[str] = set()
        self._keys_lock = threading.Lock()

    @property
    def store(self) -> RangeStore:
        """This process's handle on the cache directory."""
        return self._store.get()

    def key(self, path: str) -> str | None:
        """The cache key of ``path`` at its pinned identity; None: read uncached."""
        found = self._keys.get(path, "")
        if found != "":
            return found
        pinned = self._files.get(path)
        key = None
        if pinned is not None and (pinned[1] or self._immutable) and pinned[0] > 0:
            key = file_key(self.url(path), pinned[0], pinned[1])
        with self._keys_lock:
            self._keys[path] = key
        return key

    @property
    def checks_identity(self) -> bool:
        """Reads check each file's identity themselves, before its first download (a reader
        need not check it again)."""
        return True

    def native_reads(self) -> pafs.FileSystem | None:
        return None  # (pyarrow's own readers would bypass the cache: read bytes through it)

    def read_range(self, path: str, offset: int, size: int) -> bytes:
        key = self.key(path)
        if key is None:
            self._check(path)
            return self._download(path, offset, size)
        store = self.store
        data = store.get(key, offset, size)
        if data is not None:
            self.counter.add(hits=1, bytes_from_cache=size)
            return data
        with store.claim(key, offset, size):
            data = store.get(key, offset, size)  # another process fetched it meanwhile
            if data is not None:
                self.counter.add(hits=1, bytes_from_cache=size)
                return data
            self._check(path)
            data = self._download(path, offset, size)
            self.counter.add(misses=1, bytes_from_store=size)
            store.put(key, offset, data)
        return data

    def open_input(self, path: str) -> pa.NativeFile:
        """``path`` as a pyarrow file whose reads are cached range reads (its size is the
        pinned one: opening makes no request)."""
        pinned = self._files.get(path)
        if self.key(path) is None or pinned is None:
            self._check(path)
            return super().open_input(path)
        return RangeFile(pinned[0], {}, functools.partial(self.read_range, path)).arrow()

    def file_size(self, path: str) -> int:
        pinned = self._files.get(path)
        if pinned is not None and pinned[0] > 0 and self.key(path) is not None:
            return pinned[0]
        return super().file_size(path)

    def pinned_version(self, path: str) -> str | None:
        pinned = self._files.get(path)
        return pinned[1] if pinned is not None and pinned[1] and self.key(path) else None

    def metadata_dir(self, name: str, given: str | None) -> str | None:
        return given if given is not None else os.path.join(self.store.root, "meta", name)

    def _download(self, path: str, offset: int, size: int) -> bytes:
        self.counter.add(requests=1)
        return FileSystemSpec.read_range(self, path, offset, size)

    def _check(self, path: str) -> None:
        """The file is still what the plan pinned (once per process and file, before its first
        download): an entry is only ever written under the identity the store reported.

        Trusted (the listing just told the identity), a file on a store read natively is still
        opened natively here (a HEAD, its handle kept for the downloads): otherwise each
        download of a file of known size is one ranged GET through fsspec, whose botocore
        costs 4.2 ms of CPU under the GIL against 1.4 ms outside it for the native HEAD and
        GET (docs/benchmarks.md#cached-downloads-opened-natively).
        """
        if path in self._checked:
            return
        pinned = self._files.get(path)
        if not self._trusted and pinned is not None:
            self.counter.add(requests=1)
            check_identity(path, pinned, self._inner)  # (natively, also an open: `head`)
        elif FileSystemSpec.native_reads(self) is not None:
            self.counter.add(requests=1)
            self.head(path)
        with self._keys_lock:
            self._checked.add(path)

    def __reduce__(self) -> tuple[Any, ...]:
        flags = {"immutable": self._immutable, "trusted": self._trusted}
        return (_rebuild, (self._inner, self.config, self.counter, self._files, flags))

    def __repr__(self) -> str:
        return f"CachingFileSystem({self._inner!r}, cache_dir={self.config.directory!r})"


def _rebuild(
    inner: FileSystemSpec,
    config: CacheConfig,
    counter: CacheCounter,
    files: Mapping[str, Identity],
    flags: dict[str, bool],
) -> CachingFileSystem:
    return CachingFileSystem(inner, config, counter, files, **flags)
