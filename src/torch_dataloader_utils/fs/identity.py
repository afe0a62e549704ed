"""A file's identity as the store reports it cheaply, pinned at planning and checked at reading.

The plan records each file's size and one version token from the listing: a generation (GCS),
an ETag (S3, Azure, HTTP) or a modification time (local disks, stores without ETags). A file
replaced after planning under the same name (other values, rows appended, a shorter copy) is
then an error naming the file and what changed, never rows read from a file the plan did not
describe. The token is taken from the same kind of metadata at both ends (fsspec's ``info``, or
the same fields of a native open's answer: `FileSystemSpec.head`), and compared only when the
store reports the same field at both ends (an S3 listing and a HEAD both carry the ETag; a
version id appears only in a HEAD, so it is not used).

A check costs one metadata request, or none when a reader's own open of the file made one
since it began: the open and the check then share it (`since`).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from ..errors import FileChangedError, TorchDataloaderUtilsError
from .errors import translate_os_error
from .hub import pinned_at_commit
from .spec import FileSystemSpec

__all__ = ["Identity", "check_identity", "version_of"]

# (size in bytes, version token "field=value" or "" when the store reports none)
Identity = tuple[int, str]

# Fields that change whenever an object's bytes do, best first. A generation or ETag names the
# content; a modification time is what a local disk offers (copies that keep times, such as
# ``cp -p``, ``rsync -a`` and ``shutil.copytree``, keep it too).
_VERSION_FIELDS = (
    "generation",
    "ETag",
    "etag",
    "mtime",
    "LastModified",
    "last_modified",
    "updated",
)


def version_of(info: Mapping[str, Any]) -> str:
    """The version token of an fsspec ``info`` dict: ``"field=value"``, or ``""``."""
    for name in _VERSION_FIELDS:
        value = info.get(name)
        if value not in (None, ""):
            return f"{name}={value}"
    return ""


def check_identity(
    path: str, pinned: Identity, fs: FileSystemSpec, *, since: float | None = None
) -> None:
    """Check that ``path`` is still the file the plan describes (one metadata request, or
    none when this process made one at or after ``since``, a `time.monotonic` reading).

    Raises:
        FileChangedError: its size or version differs from the pinned one.
        StorageNotFoundError: it was deleted.
        StorageError: the request failed.
    """
    url = fs.url(path)
    if fs.protocol == "hf" and pinned_at_commit(path) is not None:
        return  # a path at a Hub commit names bytes that never change
    try:
        if fs.is_local:
            # What fsspec's local ``info`` reports (a link's target), without building its
            # dict: an epoch of small files checks each one
            # (docs/adr/0020-measurements-behind-constants.md#small-local-files).
            st = os.stat(path)
            info: Mapping[str, Any] = {"size": st.st_size, "mtime": st.st_mtime}
        else:
            info = fs.head(path, since=since)
            field = pinned[1].partition("=")[0]
            if field and fs.native and _field(info, field) is None:
                info = fs.info(path)  # (the field is fsspec's only: a modification time)
    except TorchDataloaderUtilsError:
        raise
    except OSError as exc:
        raise translate_os_error(exc, url) from exc
    size, version = pinned
    reported = info.get("size")
    now = int(reported) if reported is not None else size  # (a store may not say)
    if size and now != size:  # (0: the listing did not say)
        grown = "rows appended or " if now > size else "truncated or "
        raise FileChangedError(
            f"{url}: changed after planning: {size} bytes then, {now} now ({grown}replaced). "
            "The plan no longer describes it: create the loader again to plan the data as it "
            "is now"
        )
    if not version:
        return
    name, _, then = version.partition("=")
    current = _field(info, name)
    if current is not None and f"{current}" != then:
        raise FileChangedError(
            f"{url}: changed after planning: {name} was {then}, is {current} now (the same "
            "size, other bytes). The plan no longer describes it: create the loader again to "
            "plan the data as it is now"
        )


def _field(info: Mapping[str, Any], name: str) -> Any:
    """Field ``name`` of ``info`` whatever its case (adlfs lists ``etag``, a native open
    reports ``ETag``); None when absent."""
    if name in info:
        return info[name]
    lowered = name.lower()
    return next((value for key, value in info.items() if key.lower() == lowered), None)
