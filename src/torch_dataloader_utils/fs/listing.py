"""Turn a source (path, directory, glob, brace pattern or list of them) into a list of files.

The order is deterministic: each directory or glob expands in sorted order, and a list keeps the
order the user gave. Hidden files and directories (``.name``) and marker or metadata files
(``_SUCCESS``, ``_metadata``, ``_temporary/``) are skipped inside directories and globs; a file
named explicitly is always read. A file reached twice is an error, never read twice.
"""

from __future__ import annotations

import logging
import os
import posixpath
from collections.abc import Sequence
from dataclasses import dataclass

from braceexpand import braceexpand

from ..errors import InvalidSourceError, StorageError, TorchDataloaderUtilsError
from .errors import translate_os_error
from .hub_listing import list_hub
from .identity import version_of
from .progress import LOG_EVERY, Progress
from .retry import as_os_error, is_sdk_error, scrub
from .spec import FileSystemSpec

__all__ = ["ListedFile", "Paths", "SourceFile", "list_files"]

# What a source's files are given as: a path or URL, a directory, a glob, or a list of them.
Paths = str | os.PathLike[str] | Sequence[str | os.PathLike[str]]

_GLOB_CHARS = frozenset("*?[")

logger = logging.getLogger("torch_dataloader_utils.planning")


@dataclass(frozen=True, slots=True)
class ListedFile:
    """One file a listing found (of a source's files).

    Attributes:
        path: the path without protocol, as the filesystem expects it.
        size: size in bytes.
        base: the directory the file was found under (for hive partition parsing), or its parent
            when named explicitly.
        version: the store's version token (``"ETag=..."``, ``"mtime=..."``; see
            `fs.identity`), ``""`` when it reports none.
    """

    path: str
    size: int
    base: str
    version: str = ""


SourceFile = ListedFile  # the earlier name (format authors' code types files with it)


def _is_hidden(relative: str) -> bool:
    return any(part.startswith((".", "_")) for part in relative.split("/") if part)


def _relative(path: str, base: str) -> str:
    """``path`` relative to ``base``: a string cut when it lies under it, as listings return
    (``posixpath.relpath`` is slow on a million files:
    docs/adr/0020-measurements-behind-constants.md#paths-and-listings)."""
    if not base:
        return path
    cut = len(base) if base.endswith("/") else len(base) + 1
    if path.startswith(base) and (base.endswith("/") or path[len(base) : cut] == "/"):
        return path[cut:]
    return posixpath.relpath(path, base)


def _glob_base(pattern: str) -> str:
    parts = pattern.split("/")
    for i, part in enumerate(parts):
        if _GLOB_CHARS & set(part):
            return "/".join(parts[:i])
    return posixpath.dirname(pattern)


def _expand_one(pattern: str, fs: FileSystemSpec) -> list[ListedFile]:
    path = fs.strip(pattern)
    url = fs.url(path)
    if fs.protocol == "hf":  # resolved to a commit, listed there (`fs.hub`; retries its own)
        return [ListedFile(*f) for f in list_hub(path, fs)]
    try:
        # One request (a listing or a stat, with its pages), retried as any other.
        return fs.request(lambda: _list_one(path, url, fs), what=url)
    except TorchDataloaderUtilsError:
        raise
    except Exception as exc:
        error = as_os_error(exc)  # also SDK errors that are not OSError (adlfs's)
        if error is not None:
            raise translate_os_error(error, url) from exc
        if is_sdk_error(exc):  # no credentials, a bad endpoint URL, ...
            raise StorageError(f"{url}: {type(exc).__name__}: {scrub(str(exc))}") from exc
        raise


def _list_one(path: str, url: str, fs: FileSystemSpec) -> list[ListedFile]:
    fsys = fs.fsspec()
    if _GLOB_CHARS & set(path):
        base = _glob_base(path)
        found = fsys.glob(path, detail=True)
        files = [
            ListedFile(p, int(info.get("size") or 0), base, version_of(info))
            for p, info in sorted(found.items())
            if info.get("type") == "file" and not _is_hidden(_relative(p, base))
        ]
        if not files:
            raise InvalidSourceError(f"{url}: the pattern matched no files")
        return files
    info = fsys.info(path)
    if info.get("type") == "directory":
        if fs.is_local:
            files = _local_files(path)
        else:
            found = fsys.find(path, detail=True)
            files = [
                ListedFile(p, int(i.get("size") or 0), path, version_of(i))
                for p, i in sorted(found.items())
                if i.get("type") == "file" and not _is_hidden(_relative(p, path))
            ]
        if not files:
            raise InvalidSourceError(f"{url}: the directory holds no data files")
        return files
    return [ListedFile(path, int(info.get("size") or 0), posixpath.dirname(path), version_of(info))]


def _local_files(root: str) -> list[ListedFile]:
    """The files under the local directory ``root``, as fsspec's ``find`` lists them (regular
    files, not symbolic links; directories walked, not linked ones; unreadable directories
    left out), hidden ones left out, sorted by path, with the version fsspec's ``info`` gives
    (``mtime``). Walked with ``os.scandir``: fsspec's ``find`` builds an 11-field dict per file,
    several times slower (docs/adr/0020-measurements-behind-constants.md#paths-and-listings)."""
    files: list[ListedFile] = []
    pending = [root]
    while pending:
        folder = pending.pop()
        try:
            entries = list(os.scandir(folder))
        except OSError:
            if folder == root:
                raise
            continue  # (fsspec's walk omits what it cannot list)
        for entry in entries:
            name = entry.name
            if name.startswith((".", "_")):
                continue  # hidden: neither the file nor anything under the directory
            try:
                if entry.is_dir(follow_symlinks=False):
                    pending.append(entry.path)
                elif entry.is_file(follow_symlinks=False):
                    stat = entry.stat(follow_symlinks=False)
                    files.append(
                        ListedFile(entry.path, stat.st_size, root, f"mtime={stat.st_mtime}")
                    )
            except FileNotFoundError:
                continue  # removed while listed
    files.sort(key=lambda f: f.path)
    return files


def list_files(source: Paths, fs: FileSystemSpec) -> list[ListedFile]:
    """Expand ``source`` into files, in a deterministic order.

    Args:
        source: a path or URL, a directory (read recursively), a glob (``*.parquet``), a brace
            pattern (``part-{000..127}.parquet``, ``{a,b}``), or a list of any of these.
        fs: the filesystem the paths live on.

    Returns:
        The files, each once. ``fs`` remembers their sizes in this process
        (`FileSystemSpec.listed`): opening them makes no metadata request.

    Raises:
        StorageNotFoundError: a named path does not exist.
        InvalidSourceError: nothing matched, a file is reached twice, or an entry is a shell
            ``pipe:`` (webdataset's ``pipe:curl ...``).
    """
    entries = [source] if isinstance(source, str | os.PathLike) else list(source)
    if not entries:
        raise InvalidSourceError("the source is an empty list")
    patterns: list[str] = []
    for entry in entries:
        if os.fspath(entry).startswith("pipe:"):
            # webdataset's "pipe:CMD" runs CMD in a shell: a source string must never execute.
            raise InvalidSourceError(
                f"{os.fspath(entry)[:80]!r}: shell pipe: sources are not supported (they run a "
                "command); name the files by URL instead (s3://, gs://, abfs://, https://, a "
                "local path): every fsspec filesystem is read directly, with retries"
            )
        patterns.extend(braceexpand(os.fspath(entry)))
    files: list[ListedFile] = []
    progress = Progress("paths listed", len(patterns))
    for pattern in patterns:
        files.extend(_expand_one(pattern, fs))
        progress.add()
    progress.finish()
    if progress.elapsed >= LOG_EVERY:
        logger.info("planning: listed %d files in %.1f s", len(files), progress.elapsed)
    seen: set[str] = set()
    for f in files:
        if f.path in seen:
            raise InvalidSourceError(
                f"{fs.url(f.path)}: the source names this file more than once; "
                "each file must appear once or its rows would be read twice"
            )
        seen.add(f.path)
    if not fs.is_local:  # opening a listed file then asks nothing: the listing told its size
        fs.listed((f.path, f.size) for f in files)
    return files
