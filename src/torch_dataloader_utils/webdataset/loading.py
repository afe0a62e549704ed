"""Where a shard's index comes from: its sibling ``.idx``, a local cache, or a header-only
scan of the shard (then cached).

Scanning costs a pass over every header of the shard (for a remote shard, reads of most of its
bytes when members are small), in every process that needs the index: the planning process and
each DataLoader worker. The cache (or a sibling ``.idx`` written by ``tdu index``) makes that
once per shard; where a scanned index cannot be cached, a `TorchDataloaderUtilsWarning` says so,
once per process.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import tempfile
import warnings
from typing import TYPE_CHECKING

from ..errors import CorruptFileError, InvalidArgumentError, TorchDataloaderUtilsWarning
from ..fs.errors import translate_os_error
from ..fs.forks import ProcessLocal
from .index import VERSION, ShardIndex, build_index, format_index, index_path, parse_index

if TYPE_CHECKING:
    from ..fs.spec import FileSystemSpec

__all__ = ["default_cache_dir", "load_index"]

logger = logging.getLogger(__name__)

# Changes whenever the way an index is built changes, so old cache entries are not reused.
_CACHE_SCHEMA = "1"
# The shards this process warned about (the first only): each worker warns once, forked or not.
_warned: ProcessLocal[list[str]] = ProcessLocal(list)


def default_cache_dir() -> str:
    """``$XDG_CACHE_HOME/torch_dataloader_utils/wds-index`` (``~/.cache`` by default)."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "torch_dataloader_utils", "wds-index")


def load_index(
    path: str,
    fs: FileSystemSpec,
    *,
    size: int,
    lowercase: bool = True,
    cache_dir: str | None = None,
    version: str | None = None,
) -> ShardIndex:
    """A shard's index: its sibling ``.idx`` when there is one, else the local cache, else a
    header-only scan of the shard (then cached).

    The sibling (`index_path`) is a ``v1.2`` DALI index, checked against the shard's size; a
    ``v1.1`` sibling holds no names, so the shard is scanned instead. The cache holds ``v1.2``
    files named by a hash of the shard's URL, size, version (ETag or mtime, asked of the
    filesystem when not given) and ``lowercase``; it is written atomically, and a cache
    directory that cannot be written only means no cache. A cache entry that does not parse or
    check is rebuilt. Nothing is ever written next to the data.

    Args:
        path: the shard's path (no protocol).
        fs: its filesystem.
        size: its size in bytes (from the listing).
        lowercase: lower-case extensions.
        cache_dir: where cached indexes live; None: `default_cache_dir`; ``""``: no cache.
        version: a string that changes when the shard changes (ETag, mtime), if known.

    Returns:
        The index.

    Raises:
        CorruptFileError: the sibling index does not parse or does not fit the shard (names it
            and the line), or the shard is corrupt (names it and the offset).
        StorageError: reading failed (names the shard's URL).
    """
    cache_file = None
    if cache_dir != "" and version is not None:  # known without a request: try the cache first
        cache_file = _cache_file(cache_dir, fs.url(path), size, version, lowercase)
        cached = _read_cache(cache_file, size, lowercase)
        if cached is not None:
            return cached
    sibling = index_path(path)
    text = _read_optional(fs, sibling)
    if text is not None:
        where = f"{fs.url(sibling)} (the index of {fs.url(path)})"
        index = parse_index(text, where=where, lowercase=lowercase)
        if index.version == VERSION:
            index.check(size, where=where)
            if cache_file is not None:  # a node-local cache keeps it: no request next time
                _write_cache(cache_file, index, fs.url(path))
            return index
        logger.info("%s: a %s index has no member names; scanning the shard", where, index.version)
    if cache_dir != "" and cache_file is None:
        version = _version(fs, path)
        if version is not None:
            cache_file = _cache_file(cache_dir, fs.url(path), size, version, lowercase)
            cached = _read_cache(cache_file, size, lowercase)
            if cached is not None:
                return cached

    def read(offset: int, n: int) -> bytes:
        try:
            return fs.read_range(path, offset, n)
        except OSError as exc:
            raise translate_os_error(exc, fs.url(path)) from exc

    index = build_index(read, size, where=fs.url(path), lowercase=lowercase)
    if cache_file is None:
        why = "index_cache_dir is ''" if cache_dir == "" else "the filesystem gives no version"
        _uncached(fs.url(path), why)
    else:
        _write_cache(cache_file, index, fs.url(path))
    return index


def _cache_file(cache_dir: str | None, url: str, size: int, version: str, lowercase: bool) -> str:
    material = "\0".join([_CACHE_SCHEMA, url, str(size), version, str(lowercase)])
    name = hashlib.sha256(material.encode("utf-8", "surrogateescape")).hexdigest()
    return os.path.join(cache_dir or default_cache_dir(), name + ".idx")


def _uncached(url: str, why: str) -> None:
    """Warn, once per process, that an index built by scanning is not cached."""
    warned = _warned.get()
    if warned:
        return
    warned.append(url)
    # A warning, not a log line: the package logger's NullHandler would hide it, and the fix
    # is the user's to make.
    warnings.warn(
        f"{url}: its index was built by scanning the shard's headers and cannot be cached "
        f"({why}): every process that reads it (each DataLoader worker, each epoch's new "
        "workers) scans every shard again. Write sibling indexes once with `tdu index`, or "
        "pass a writable index_cache_dir in format_options. (Said once per process.)",
        TorchDataloaderUtilsWarning,
        stacklevel=2,
    )


def _read_optional(fs: FileSystemSpec, path: str) -> str | None:
    def cat() -> bytes:
        return bytes(fs.fsspec().cat_file(path))

    try:
        data = fs.request(cat, what=fs.url(path))
    except FileNotFoundError:
        return None
    return data.decode("utf-8", "surrogateescape")


def _version(fs: FileSystemSpec, path: str) -> str | None:
    """The ETag or modification time the filesystem reports, or None (then no cache)."""
    info = fs.request(lambda: fs.fsspec().info(path), what=fs.url(path))
    for field in ("ETag", "etag", "mtime", "LastModified", "last_modified", "updated"):
        value = info.get(field)
        if value is not None:
            return f"{field}={value}"
    logger.debug("%s: no ETag or mtime: its index is not cached", fs.url(path))
    return None


def _read_cache(cache_file: str, size: int, lowercase: bool) -> ShardIndex | None:
    try:
        with open(cache_file, encoding="utf-8", errors="surrogateescape") as f:
            text = f.read()
    except OSError:
        return None
    try:
        index = parse_index(text, where=cache_file, lowercase=lowercase)
        index.check(size, where=cache_file)
    except CorruptFileError as exc:
        logger.warning("ignoring a corrupt cached index (rebuilding it): %s", exc)
        return None
    return index


def _write_cache(cache_file: str, index: ShardIndex, url: str) -> None:
    try:
        text = format_index(index)
    except InvalidArgumentError as exc:
        _uncached(url, str(exc))
        return
    directory = os.path.dirname(cache_file)
    temp = None
    try:
        os.makedirs(directory, exist_ok=True)
        fd, temp = tempfile.mkstemp(dir=directory, prefix=".tmp-", suffix=".idx")
        with os.fdopen(fd, "wb") as f:
            f.write(text.encode("utf-8", "surrogateescape"))
        os.replace(temp, cache_file)  # atomic: readers see the old file or the whole new one
        temp = None
    except OSError as exc:
        _uncached(url, f"cannot write {directory}: {exc}")
    finally:
        if temp is not None:
            with contextlib.suppress(OSError):
                os.unlink(temp)
