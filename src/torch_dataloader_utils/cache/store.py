"""The cache on disk: byte ranges of remote files and planning metadata, shared by every
process on a machine, with no server.

Layout under ``<cache_dir>/tdu-cache-v1/``::

    data/<k[:2]>/<k>/<offset>-<size>   a byte range of the file keyed <k>
    meta/wds-index/<h>.idx             WebDataset tar indexes (`FileSystemSpec.metadata_dir`)
    locks/<n>                          striped locks: one download of a range at a time
    usage                              bytes held (locked with flock while changed)

A key is a hash of the file's URL and the identity the plan pinned (size and ETag, generation
or mtime), never of storage options: no secret reaches a name, and a changed file has another
key, so it is never served stale. Each entry is a 16-byte header (magic, CRC-32 and size of the
payload) and the payload, written to a temporary name and renamed into place: a reader sees a
whole entry or none, and one whose check fails (a torn write after a power loss, a disk error)
is removed and read from the store again. A killed process leaves at most a temporary file,
never served, removed by the next eviction scan.

Eviction keeps what this loader uses (see docs/adr/0014-cache.md): entries used since the loader
was made are never evicted for its other reads; the least recently used of the rest go first.
When the rest is gone, new ranges are read without being stored (``bypassed``), so a cache
smaller than the data serves the same share of it every epoch instead of churning.
"""

from __future__ import annotations

import bisect
import contextlib
import errno
import hashlib
import logging
import os
import shutil
import struct
import threading
import warnings
import zlib
from collections import OrderedDict
from collections.abc import Iterator
from dataclasses import dataclass

try:
    import fcntl
except ImportError:  # Windows: no cache (see `open_store`)
    fcntl = None  # type: ignore[assignment]

from ..errors import InvalidArgumentError, TorchDataloaderUtilsWarning
from .config import CacheConfig
from .room import Room
from .stats import CacheCounter

__all__ = ["ROOT", "CacheSummary", "RangeStore", "file_key", "open_store"]

logger = logging.getLogger("torch_dataloader_utils.cache")

ROOT = "tdu-cache-v1"
_HEADER = struct.Struct("<4sIQ")  # magic, CRC-32 of the payload, payload bytes
_MAGIC = b"TDUc"
# Download locks: one file each, opened once per process (a lock is a thread lock plus an
# `flock`, which does not exclude threads sharing the file).
_STRIPES = 128
# Entries read back whole and checked, kept per process so that many small reads of one entry
# (pyarrow reading a column chunk in pages) check it once. Entries up to an eighth of it.
_VERIFIED_BYTES = 32 << 20


def file_key(url: str, size: int, version: str) -> str:
    """The key of a file at one identity: a hash, so no name holds a URL's secrets."""
    material = "\0".join([ROOT, url, str(size), version])
    return hashlib.sha256(material.encode("utf-8", "surrogateescape")).hexdigest()[:40]


@dataclass(frozen=True)
class CacheSummary:
    """What a cache directory holds (`RangeStore.summary`)."""

    directory: str
    files: int  # distinct remote files with ranges held
    ranges: int
    metadata: int  # planning metadata entries
    bytes: int  # on disk, headers included
    limit: int | None
    leftovers: int  # temporary files of writes that did not finish


class RangeStore:
    """One process's handle on a cache directory (threads share it)."""

    def __init__(self, config: CacheConfig, counter: CacheCounter | None = None) -> None:
        self.config = config
        self.counter = counter or CacheCounter()
        self.root = os.path.join(config.directory, ROOT)
        self._data = os.path.join(self.root, "data")
        self._meta = os.path.join(self.root, "meta")
        self._locks = os.path.join(self.root, "locks")
        for path in (self._data, self._meta, self._locks):
            os.makedirs(path, exist_ok=True)
        self._lists: dict[str, list[tuple[int, int]]] = {}  # file key → sorted (offset, size)
        self._verified: OrderedDict[str, bytes] = OrderedDict()
        self._verified_bytes = 0
        self._lock = threading.Lock()
        self._warned = False
        self._stripes = [threading.Lock() for _ in range(_STRIPES)]
        self._stripe_fds: dict[int, int] = {}
        self.room = Room(self.root, (self._data, self._meta), config, self.counter, self._forget)

    def close(self) -> None:
        """Close this handle's lock files (the cache stays; a handle is made per reader)."""
        fds, self._stripe_fds = list(self._stripe_fds.values()), {}
        for fd in fds:
            with contextlib.suppress(OSError):
                os.close(fd)
        self.room.close()

    def __del__(self) -> None:
        with contextlib.suppress(Exception):  # (at interpreter exit, os may be gone)
            self.close()

    # --- byte ranges -----------------------------------------------------------------------

    def get(self, key: str, offset: int, size: int) -> bytes | None:
        """Bytes ``[offset, offset + size)`` of the file ``key`` from entries that cover them
        (one, or several side by side), or None."""
        folder = self._folder(key)
        exact = self._read(os.path.join(folder, f"{offset}-{size}"))
        if exact is not None:
            return exact
        # What this process listed of the file first; listed again (others may have written
        # since) only if that was not just now.
        passes = (False, True) if key in self._lists else (True,)
        for fresh in passes:
            cover = self._cover(key, offset, size, fresh=fresh)
            if cover is None:
                continue
            parts = []
            for start, n in cover:
                data = self._read(os.path.join(folder, f"{start}-{n}"))
                if data is None:
                    break  # evicted meanwhile
                lo = max(offset, start) - start
                parts.append(memoryview(data)[lo : min(offset + size, start + n) - start])
            else:
                return parts[0].tobytes() if len(parts) == 1 else b"".join(parts)
        return None

    def put(self, key: str, offset: int, data: bytes) -> bool:
        """Store ``data`` as bytes ``[offset, ...)`` of the file ``key``; False when it was not
        stored (no room, or the disk refused: the caller has the bytes either way)."""
        folder = self._folder(key)
        name = f"{offset}-{len(data)}"
        if os.path.exists(os.path.join(folder, name)):
            return True
        stored = self._write(folder, name, data)
        if stored:
            with self._lock:
                spans = self._lists.setdefault(key, [])
                bisect.insort(spans, (offset, len(data)))
        return stored

    @contextlib.contextmanager
    def claim(self, key: str, offset: int, size: int) -> Iterator[None]:
        """Held while one process downloads this range: others asking for it wait, then find
        it stored. (Striped: an unrelated range may wait too, rarely.)"""
        stripe = zlib.crc32(f"{key}:{offset}:{size}".encode()) % _STRIPES
        with self._stripes[stripe]:
            fd = self._stripe_fds.get(stripe)
            if fd is None:
                path = os.path.join(self._locks, str(stripe))
                fd = self._stripe_fds[stripe] = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
            fcntl.flock(fd, fcntl.LOCK_EX)  # released below, or when the process dies
            try:
                yield
            finally:
                fcntl.flock(fd, fcntl.LOCK_UN)

    # --- the whole cache -------------------------------------------------------------------

    def summary(self) -> CacheSummary:
        """What the directory holds now (a scan)."""
        scan = self.room.scan(clean=False)
        entries, leftovers = scan.entries, scan.leftovers
        data = [e for e in entries if e.path.startswith(self._data)]
        return CacheSummary(
            directory=self.config.directory,
            files=len({os.path.dirname(e.path) for e in data}),
            ranges=len(data),
            metadata=len(entries) - len(data),
            bytes=sum(e.size for e in entries),
            limit=self.config.limit,
            leftovers=leftovers,
        )

    def _forget(self) -> None:
        """Forget the entries listed (some were evicted)."""
        with self._lock:
            self._lists.clear()

    def clear(self) -> None:
        """Remove every entry (the directory's ``tdu-cache-v1`` folder)."""
        shutil.rmtree(self.root, ignore_errors=True)
        with self._lock:
            self._lists.clear()
            self._verified.clear()
            self._verified_bytes = 0

    # --- entries ---------------------------------------------------------------------------

    def _folder(self, key: str) -> str:
        return os.path.join(self._data, key[:2], key)

    def _read(self, path: str) -> bytes | None:
        """An entry's payload, checked; None when absent or bad (a bad one is removed)."""
        with self._lock:
            found = self._verified.get(path)
            if found is not None:
                self._verified.move_to_end(path)
                return found
        try:
            with open(path, "rb") as f:
                head = f.read(_HEADER.size)
                data = f.read()  # the payload, read into its own bytes (no copy after)
                mtime = os.fstat(f.fileno()).st_mtime
        except FileNotFoundError:
            return None
        except OSError as exc:
            logger.warning("%s: cache entry unreadable (%s); reading from the store", path, exc)
            return None
        ok = len(head) == _HEADER.size
        if ok:
            magic, crc, size = _HEADER.unpack(head)
            ok = magic == _MAGIC and size == len(data) and zlib.crc32(data) == crc
        if not ok:
            logger.warning("%s: cache entry failed its check; removed, read from the store", path)
            self.counter.add(corrupt=1)
            with contextlib.suppress(OSError):
                os.unlink(path)
                self.room.release(len(head) + len(data))
            return None
        if mtime < self.config.since:  # used by this loader from now on: kept (see the module)
            with contextlib.suppress(OSError):
                os.utime(path)
        if len(data) <= _VERIFIED_BYTES // 8:
            with self._lock:
                self._verified[path] = data
                self._verified_bytes += len(data)
                while self._verified_bytes > _VERIFIED_BYTES:
                    _, old = self._verified.popitem(last=False)
                    self._verified_bytes -= len(old)
        return data

    def _write(self, folder: str, name: str, data: bytes) -> bool:
        n = _HEADER.size + len(data)
        tmp = os.path.join(folder, f".{name}.{os.getpid()}-{threading.get_ident()}.{n}.tmp")
        try:
            fd = self.room.reserve(n, tmp)
        except OSError as exc:
            fd = None
            self._failed(exc)
        if fd is None:
            self.counter.add(bypassed=1)
            return False
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(_HEADER.pack(_MAGIC, zlib.crc32(data), len(data)))
                f.write(data)
            os.replace(tmp, os.path.join(folder, name))
        except OSError as exc:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            self.room.release(n)
            self._failed(exc)
            return False
        return True

    def _failed(self, exc: OSError) -> None:
        """Count a write that failed, and warn once per process."""
        self.counter.add(write_errors=1)
        if not self._warned:
            self._warned = True
            full = exc.errno in (errno.ENOSPC, errno.EDQUOT)
            warnings.warn(  # the user's to fix (space, cache_limit): not only a log line
                f"cache {self.config.directory}: cannot write an entry "
                f"({exc}{': the disk is full' if full else ''}); reading on from the store "
                "without caching what does not fit. (Said once per process.)",
                TorchDataloaderUtilsWarning,
                stacklevel=3,
            )

    def _cover(
        self, key: str, offset: int, size: int, *, fresh: bool
    ) -> list[tuple[int, int]] | None:
        """Entries of ``key`` that together cover the range, or None."""
        with self._lock:
            spans = None if fresh else self._lists.get(key)
        if spans is None:
            try:
                names = os.listdir(self._folder(key))
            except FileNotFoundError:
                names = []
            spans = sorted(
                (int(a), int(b))
                for a, _, b in (n.partition("-") for n in names if not n.startswith("."))
            )
            with self._lock:
                self._lists[key] = spans
        cover, pos, end = [], offset, offset + size
        while pos < end:
            best = None
            for start, n in spans[: bisect.bisect_right(spans, (pos, 1 << 62))]:
                if start <= pos < start + n and (best is None or start + n > sum(best)):
                    best = (start, n)
            if best is None:
                return None
            cover.append(best)
            pos = sum(best)
        return cover

    # --- room ------------------------------------------------------------------------------


def open_store(config: CacheConfig, counter: CacheCounter | None = None) -> RangeStore:
    """A handle on ``config``'s directory, made if needed.

    Raises:
        InvalidArgumentError: the directory cannot be made or written (names it and why).
    """
    if fcntl is None:
        raise InvalidArgumentError(
            "cache_dir needs file locks (fcntl), which this platform lacks: read without a cache"
        )
    try:
        store = RangeStore(config, counter)
    except OSError as exc:
        raise InvalidArgumentError(
            f"cache_dir {config.directory!r}: cannot be used as a cache ({exc})"
        ) from exc
    if not os.access(store.root, os.W_OK | os.X_OK):
        raise InvalidArgumentError(f"cache_dir {config.directory!r}: not writable")
    return store
