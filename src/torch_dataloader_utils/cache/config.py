"""What a node-local cache is told: where it lives and how much it may hold."""

from __future__ import annotations

import os
import re
import time
from dataclasses import dataclass, field

from ..errors import InvalidArgumentError

__all__ = ["CACHE_DIR_VARIABLE", "CACHE_LIMIT_VARIABLE", "CacheConfig", "parse_size"]

# Set for a whole job (every rank and process) without changing code.
CACHE_DIR_VARIABLE = "TDU_CACHE_DIR"
CACHE_LIMIT_VARIABLE = "TDU_CACHE_LIMIT"

_UNITS = {
    "": 1,
    "B": 1,
    "KB": 10**3,
    "MB": 10**6,
    "GB": 10**9,
    "TB": 10**12,
    "KIB": 1 << 10,
    "MIB": 1 << 20,
    "GIB": 1 << 30,
    "TIB": 1 << 40,
}
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*$")


def parse_size(value: int | str, *, name: str = "cache_limit") -> int:
    """Bytes of ``value``: an int, or a string such as ``"50GB"``, ``"512 MiB"``, ``"1e9"``.

    Raises:
        InvalidArgumentError: not a size (names ``name`` and the value).
    """
    if isinstance(value, bool):
        raise InvalidArgumentError(f"{name} must be bytes or a size like '50GB', got {value!r}")
    if isinstance(value, int):
        size = value
    elif isinstance(value, str):
        match = _SIZE.match(value)
        suffix = match.group(2).upper() if match else ""
        if match is None or suffix not in _UNITS:
            raise InvalidArgumentError(
                f"{name} must be bytes or a size like '50GB' or '512MiB', got {value!r}"
            )
        size = int(float(match.group(1)) * _UNITS[suffix])
    else:
        raise InvalidArgumentError(
            f"{name} must be bytes or a size like '50GB', got {type(value).__name__}"
        )
    if size <= 0:
        raise InvalidArgumentError(f"{name} must be positive, got {value!r}")
    return size


@dataclass(frozen=True)
class CacheConfig:
    """A cache directory and its limit, as a loader was given them (picklable).

    Attributes:
        directory: the cache's root (absolute); nothing is written outside it.
        limit: bytes the cache may hold, entries and their headers (``None``: as much as the
            disk holds while keeping a tenth of it free).
        since: when the loader was made (``time.time()``): entries used since then belong to
            this loader and are never evicted to make room for its other reads (see
            docs/adr/0014-cache.md: an epoch-shuffled scan keeps what it has rather than
            churn).
    """

    directory: str
    limit: int | None = None
    since: float = field(default_factory=time.time)

    @classmethod
    def of(
        cls, cache_dir: str | os.PathLike[str] | None, cache_limit: int | str | None
    ) -> CacheConfig | None:
        """The config for ``cache_dir``/``cache_limit``, or from ``TDU_CACHE_DIR`` and
        ``TDU_CACHE_LIMIT`` when ``cache_dir`` is None; None when neither sets a directory
        (``cache_dir=""`` turns a job-wide cache off for one loader).

        Raises:
            InvalidArgumentError: the limit is not a size, or the directory is a file.
        """
        if cache_dir is None:
            cache_dir = os.environ.get(CACHE_DIR_VARIABLE) or None
            if cache_limit is None:
                cache_limit = os.environ.get(CACHE_LIMIT_VARIABLE) or None
        if cache_dir is None or os.fspath(cache_dir) == "":
            if cache_limit is not None and cache_dir is None:
                raise InvalidArgumentError("cache_limit needs a cache_dir (or TDU_CACHE_DIR)")
            return None
        directory = os.path.abspath(os.path.expanduser(os.fspath(cache_dir)))
        if os.path.exists(directory) and not os.path.isdir(directory):
            raise InvalidArgumentError(f"cache_dir {directory!r} is a file, not a directory")
        limit = None if cache_limit is None else parse_size(cache_limit)
        return cls(directory, limit)
