"""What the store reported of each file in this process: so that a file is asked about once.

Planning lists a prefix, which gives each file's size and version; reading checks each file
against them (`fs.identity`), with one metadata request (a HEAD); a native open makes one too.
Without a memory of what was reported, each layer that opens a file asked again: a footer read
after the listing, and a worker's open after its identity check. `Reported` remembers, per
process (`FileSystemSpec` keeps one in its per-process clients):

- the sizes a listing gave, so that opening those files asks nothing;
- the last metadata request's answer for each file, with when it was made, so that a check
  of a file opened since a reader began uses that open's answer instead of asking again.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Iterable, Mapping
from typing import Any

import pyarrow as pa

__all__ = ["Reported", "native_info"]

# Answers kept per process: one is used within moments of its request (an open, then the
# check of the same file), so a few thousand cover every file read at once.
_HEADS = 4096


def native_info(handle: pa.NativeFile) -> dict[str, Any]:
    """A native open's answer as fsspec's ``info`` names it: ``size``, and the object's
    metadata (``ETag`` on S3 and Azure, ``generation`` on GCS, ...) as strings."""
    info: dict[str, Any] = {}
    for key, value in (handle.metadata() or {}).items():
        name = key.decode() if isinstance(key, bytes) else str(key)
        info[name] = value.decode() if isinstance(value, bytes) else value
    info["size"] = int(handle.size())
    return info


class Reported:
    """Sizes and metadata answers of files, as the store reported them in this process."""

    def __init__(self) -> None:
        self._sizes: dict[str, int] = {}
        self._heads: OrderedDict[str, tuple[float, Mapping[str, Any]]] = OrderedDict()
        self._lock = threading.Lock()

    def listed(self, sizes: Iterable[tuple[str, int]]) -> None:
        """Remember the sizes a listing gave (0: it did not say)."""
        known = {path: size for path, size in sizes if size > 0}
        with self._lock:
            self._sizes.update(known)

    def size(self, path: str) -> int | None:
        """``path``'s size as last reported (a listing or a metadata request), or None."""
        return self._sizes.get(path)

    def record(self, path: str, info: Mapping[str, Any]) -> None:
        """Remember a metadata request's answer for ``path``, made now."""
        size = info.get("size")
        with self._lock:
            if size is not None and int(size) > 0:
                self._sizes[path] = int(size)
            self._heads[path] = (time.monotonic(), info)
            self._heads.move_to_end(path)
            while len(self._heads) > _HEADS:
                self._heads.popitem(last=False)

    def since(self, path: str, began: float) -> Mapping[str, Any] | None:
        """The last answer for ``path`` if its request was made at or after ``began`` (a
        `time.monotonic` reading), else None."""
        found = self._heads.get(path)
        if found is None or found[0] < began:
            return None
        return found[1]
