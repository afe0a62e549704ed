"""Room in the cache: the bytes it holds, reserved before a write and made by eviction.

Usage is one counter in ``<root>/usage``, changed under an ``flock`` (and a thread lock: an
``flock`` does not exclude threads sharing the file). A reservation creates its temporary file
while that lock is held, with the reservation in its name, so an eviction scan (under the same
lock) always sees writes in flight and never counts the cache lower than it is. Eviction keeps
what the current loader uses; see `cache.store` and docs/adr/0014-cache.md.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import struct
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

try:
    import fcntl
except ImportError:  # Windows: no cache (see `cache.store.open_store`)
    fcntl = None  # type: ignore[assignment]

from .config import CacheConfig
from .stats import CacheCounter

__all__ = ["Found", "Room"]

# After an eviction scan found no room, misses do not scan again for this long.
_FULL_PAUSE_S = 5.0
# A temporary file this old belongs to a process that died (writes take milliseconds).
_STALE_TMP_S = 600.0
# With no limit, keep this share of the disk free.
_FREE_SHARE = 0.10
_USAGE = struct.Struct("<4sQ")  # magic, bytes held
_MAGIC = b"TDUu"


@dataclass(frozen=True)
class Found:
    """An entry found by a scan."""

    path: str
    mtime: float
    size: int


@dataclass(frozen=True)
class Scan:
    """What a scan found: entries, bytes reserved by writes in flight, leftovers of writes
    that died (removed when the scan cleans)."""

    entries: list[Found]
    in_flight: int
    leftovers: int


class Room:
    """One process's accounting of a cache's bytes (threads share it).

    Args:
        root: the cache's root folder.
        tops: the folders that hold entries.
        config: the limit, and when this loader was made (its entries are kept).
        counter: where evictions are counted.
        evicted: called after entries were removed (a store forgets what it listed).
    """

    def __init__(
        self,
        root: str,
        tops: tuple[str, ...],
        config: CacheConfig,
        counter: CacheCounter,
        evicted: Callable[[], None],
    ) -> None:
        self.root = root
        self.tops = tops
        self.config = config
        self.counter = counter
        self._evicted = evicted
        self._full_until = 0.0
        self._usage_fd: int | None = None
        self._usage_thread = threading.Lock()

    def close(self) -> None:
        """Close the usage file."""
        fd, self._usage_fd = self._usage_fd, None
        if fd is not None:
            with contextlib.suppress(OSError):
                os.close(fd)

    @contextlib.contextmanager
    def _usage_lock(self) -> Iterator[int]:
        """The usage file, locked against every thread and process."""
        with self._usage_thread:
            if self._usage_fd is None:
                path = os.path.join(self.root, "usage")
                self._usage_fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
            fcntl.flock(self._usage_fd, fcntl.LOCK_EX)
            try:
                yield self._usage_fd
            finally:
                fcntl.flock(self._usage_fd, fcntl.LOCK_UN)

    def reserve(self, n: int, tmp: str) -> int | None:
        """Count ``n`` bytes into the cache's usage, making room if needed, and create the
        temporary file ``tmp`` that will hold them; its descriptor, or None: no room."""
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
                scan = self.scan(clean=True)
                used = sum(e.size for e in scan.entries) + scan.in_flight
            if used + n > limit:
                if time.monotonic() < self._full_until:
                    return None
                used = self.evict(target=limit - n, limit=limit)
                if used + n > limit:
                    self._full_until = time.monotonic() + _FULL_PAUSE_S
                    _write_usage(usage, used)
                    return None
            fd = _create(tmp)
            _write_usage(usage, used + n)
        return fd

    def release(self, n: int) -> None:
        """Give back ``n`` reserved bytes (a write that failed, an entry removed)."""
        if self.config.limit is None:
            return
        with self._usage_lock() as usage:
            used = _read_usage(usage)
            if used is not None:
                _write_usage(usage, max(0, used - n))

    def evict(self, *, target: int, limit: int) -> int:
        """Remove entries not used by this loader, least recently used first, until at most
        ``target`` bytes are held (a tenth of the limit lower, to scan less often); the bytes
        held after (recounted by the scan, writes in flight included)."""
        scan = self.scan(clean=True)
        used = sum(e.size for e in scan.entries) + scan.in_flight
        goal = max(0, target - limit // 10)
        evicted = 0
        for entry in sorted(
            (e for e in scan.entries if e.mtime < self.config.since), key=lambda e: e.mtime
        ):
            if used <= goal:
                break
            with contextlib.suppress(FileNotFoundError):
                os.unlink(entry.path)
                used -= entry.size
                evicted += 1
        if evicted:
            self.counter.add(evicted=evicted)
            self._evicted()
        return used

    def scan(self, *, clean: bool) -> Scan:
        """Every entry; temporary files of live writes counted by the reservation in their
        name, those of dead processes removed when ``clean`` (else counted as leftovers)."""
        found: list[Found] = []
        leftovers = in_flight = 0
        now = time.time()
        for top in self.tops:
            for path, _, names in os.walk(top):
                for name in names:
                    full = os.path.join(path, name)
                    try:
                        st = os.stat(full)
                    except FileNotFoundError:
                        continue
                    if not name.startswith("."):
                        found.append(Found(full, st.st_mtime, st.st_size))
                        continue
                    pid, reserved = _writer(name)
                    if now - st.st_mtime < _STALE_TMP_S and (pid is None or _alive(pid)):
                        in_flight += reserved if reserved is not None else st.st_size
                    elif clean:
                        with contextlib.suppress(OSError):
                            os.unlink(full)
                    else:
                        leftovers += 1
        return Scan(found, in_flight, leftovers)


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


def _read_usage(fd: int) -> int | None:
    raw = os.pread(fd, _USAGE.size, 0)
    if len(raw) != _USAGE.size:
        return None  # new, or torn: recounted
    magic, used = _USAGE.unpack(raw)
    return int(used) if magic == _MAGIC else None


def _write_usage(fd: int, used: int) -> None:
    os.pwrite(fd, _USAGE.pack(_MAGIC, used), 0)  # in place, under the usage lock
