"""The cache on disk: byte ranges of remote files and planning metadata, shared by every
process on a machine, with no server.

Layout under ``<cache_dir>/tdu-cache-v1/``::

    data/<k[:2]>/<k>/<offset>-<size>   a byte range of the file keyed <k>
    meta/<k[:2]>/<k>                   planning metadata (a footer's facts, a tar index)
    locks/<n>                          striped locks: one download of a range at a time
    usage                              bytes held (locked with flock while changed)

A key is a hash of the file's URL and the identity the plan pinned (size and ETag, generation
or mtime), never of storage options: no secret reaches a name, and a changed file has another
key, so it is never served stale. Each entry is a 16-byte header (magic, CRC-32 and size of the
payload) and the payload, written to a temporary name and renamed into place: a reader sees a
whole entry or none, and one whose check fails (a torn write after a power loss, a disk error)
is removed and read from the store again. A killed process leaves at most a temporary file,
never served, removed by the next eviction scan.

Eviction keeps what this run uses (see docs/adr/0014-cache.md): entries used since the loader
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
import time
import zlib
from collections import OrderedDict
from collections.abc import Iterator
from dataclasses import dataclass

try:
    import fcntl
except ImportError:  # Windows: no cache (see `open_store`)
    fcntl = None  # type: ignore[assignment]

from ..errors import InvalidArgumentError
from .config import CacheConfig
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
# After an eviction scan found no room, misses do not scan again for this long.
_FULL_PAUSE_S = 5.0
# A temporary file this old belongs to a process that died (writes take milliseconds).
_STALE_TMP_S = 600.0
# With no limit, keep this share of the disk free.
_FREE_SHARE = 0.10


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


@dataclass(frozen=True)
class _Found:
    path: str
    mtime: float
    size: int


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
        self._full_until = 0.0
        self._warned = False
        self._stripes = [threading.Lock() for _ in range(_STRIPES)]
        self._stripe_fds: dict[int, int] = {}
        self._usage_fd: int | None = None
        self._usage_thread = threading.Lock()

    def close(self) -> None:
        """Close this handle's lock files (the cache stays; a handle is made per reader)."""
        fds = [*self._stripe_fds.values(), self._usage_fd]
        self._stripe_fds, self._usage_fd = {}, None
        for fd in fds:
            if fd is not None:
                with contextlib.suppress(OSError):
                    os.close(fd)

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
        for fresh in (False, True):
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

    # --- planning metadata -----------------------------------------------------------------

    def get_meta(self, key: str) -> bytes | None:
        """A metadata entry, or None."""
        return self._read(os.path.join(self._meta, key[:2], key))

    def put_meta(self, key: str, data: bytes) -> bool:
        """Store a metadata entry (False: not stored)."""
        return self._write(os.path.join(self._meta, key[:2]), key, data)

    # --- the whole cache -------------------------------------------------------------------

    def summary(self) -> CacheSummary:
        """What the directory holds now (a scan)."""
        entries, leftovers = self._scan(clean=False)
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
                self._release(len(head) + len(data))
            return None
        if mtime < self.config.since:  # used by this run from now on: kept (see the module)
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
            fd = self._reserve(n, tmp)
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
            self._release(n)
            self._failed(exc)
            return False
        return True

    def _failed(self, exc: OSError) -> None:
        """Count a write that failed, and warn once per process."""
        self.counter.add(write_errors=1)
        if not self._warned:
            self._warned = True
            full = exc.errno in (errno.ENOSPC, errno.EDQUOT)
            logger.warning(
                "cache %s: cannot write an entry (%s%s); reading on from the store without "
                "caching what does not fit. (Said once per process.)",
                self.config.directory,
                exc,
                ": the disk is full" if full else "",
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

    @contextlib.contextmanager
    def _usage_lock(self) -> Iterator[int]:
        """The usage file (8 bytes: bytes held), locked against every thread and process."""
        with self._usage_thread:
            if self._usage_fd is None:
                path = os.path.join(self.root, "usage")
                self._usage_fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
            fcntl.flock(self._usage_fd, fcntl.LOCK_EX)
            try:
                yield self._usage_fd
            finally:
                fcntl.flock(self._usage_fd, fcntl.LOCK_UN)

    def _reserve(self, n: int, tmp: str) -> int | None:
        """Count ``n`` bytes into the cache's usage, making room if needed, and create the
        temporary file ``tmp`` that will hold them; its descriptor, or None: no room.

        The file is made while the usage lock is held, so every eviction scan (which holds it
        too) sees the reservation in the file's name: none counts the cache lower than it is.
        """
        os.makedirs(os.path.dirname(tmp), exist_ok=True)
        limit = self.config.limit
        if limit is None:
            disk = shutil.disk_usage(self.root)
            if disk.free - n < _FREE_SHARE * disk.total:
                return None
            return _create(tmp)
        if n > limit:
            return None
        with self._usage_lock() as usage:
            used = _read_usage(usage)
            if used is None:  # (new or torn: recounted, writes in flight included)
                used = sum(e.size for e in self._scan(clean=True)[0]) + self._in_flight
            if used + n > limit:
                if time.monotonic() < self._full_until:
                    return None
                used = self._evict(target=limit - n, limit=limit)
                if used + n > limit:
                    self._full_until = time.monotonic() + _FULL_PAUSE_S
                    _write_usage(usage, used)
                    return None
            fd = _create(tmp)
            _write_usage(usage, used + n)
        return fd

    def _release(self, n: int) -> None:
        if self.config.limit is None:
            return
        with self._usage_lock() as usage:
            used = _read_usage(usage)
            if used is not None:
                _write_usage(usage, max(0, used - n))

    def _evict(self, *, target: int, limit: int) -> int:
        """Remove entries not used by this run, least recently used first, until at most
        ``target`` bytes are held (a tenth of the limit lower, to scan less often); the bytes
        held after (recounted by the scan, writes in flight included)."""
        entries, _ = self._scan(clean=True)
        reserved = self._in_flight
        used = sum(e.size for e in entries) + reserved
        goal = max(0, target - limit // 10)
        evicted = 0
        for entry in sorted(
            (e for e in entries if e.mtime < self.config.since), key=lambda e: e.mtime
        ):
            if used <= goal:
                break
            with contextlib.suppress(FileNotFoundError):
                os.unlink(entry.path)
                used -= entry.size
                evicted += 1
        if evicted:
            self.counter.add(evicted=evicted)
            with self._lock:
                self._lists.clear()
        return used

    _in_flight = 0  # set by `_scan`: bytes reserved by writes not finished

    def _scan(self, *, clean: bool) -> tuple[list[_Found], int]:
        """Every entry; temporary files of live writes counted in ``_in_flight`` (by the
        reservation in their name), those of dead processes removed when ``clean``."""
        found: list[_Found] = []
        leftovers = in_flight = 0
        now = time.time()
        for top in (self._data, self._meta):
            for path, names in _walk(top):
                for name in names:
                    full = os.path.join(path, name)
                    try:
                        st = os.stat(full)
                    except FileNotFoundError:
                        continue
                    if not name.startswith("."):
                        found.append(_Found(full, st.st_mtime, st.st_size))
                        continue
                    pid, reserved = _writer(name)
                    if now - st.st_mtime < _STALE_TMP_S and (pid is None or _alive(pid)):
                        in_flight += reserved if reserved is not None else st.st_size
                    elif clean:
                        with contextlib.suppress(OSError):
                            os.unlink(full)
                    else:
                        leftovers += 1
        self._in_flight = in_flight
        return found, leftovers


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


def _walk(top: str) -> Iterator[tuple[str, list[str]]]:
    """Folders under ``top`` and the files in each."""
    for path, _, names in os.walk(top):
        yield path, names


def _writer(name: str) -> tuple[int | None, int | None]:
    """The process and reservation of a temporary file ``.<name>.<pid>-<thread>.<n>.tmp``
    (Nones for another kind: a tar index's)."""
    parts = name.rsplit(".", 3)
    if len(parts) != 4 or parts[3] != "tmp":
        return None, None
    pid, _, _ = parts[1].partition("-")
    if not (pid.isdigit() and parts[2].isdigit()):
        return None, None
    return int(pid), int(parts[2])


def _alive(pid: int) -> bool:
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _create(path: str) -> int:
    """A new file for writing (with the user's umask)."""
    return os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o666)


_USAGE = struct.Struct("<4sQ")  # magic, bytes held


def _read_usage(fd: int) -> int | None:
    raw = os.pread(fd, _USAGE.size, 0)
    if len(raw) != _USAGE.size:
        return None  # new, or torn: recounted
    magic, used = _USAGE.unpack(raw)
    return int(used) if magic == _MAGIC else None


def _write_usage(fd: int, used: int) -> None:
    os.pwrite(fd, _USAGE.pack(_MAGIC, used), 0)  # in place, under the usage lock
