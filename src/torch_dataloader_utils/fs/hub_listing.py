"""Listing a Hugging Face Hub path at the commit its revision names now (`fs.hub`'s requests).

Planning resolves a path's revision once to its commit and lists the files there (one
revision request, one tree listing with its pages); each listed path carries ``@<commit>`` and
its content hash as its version token (the LFS sha256, else the git blob id), and the plan's
details name the commit (`commit_details`).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any
from urllib.parse import quote

from ..errors import InvalidSourceError, StorageNotFoundError
from .hub import (
    PROTOCOL,
    HubAccess,
    HubPath,
    check_answer,
    endpoint,
    pinned_at_commit,
    resolve_commit,
    send,
)

__all__ = ["HubFile", "commit_details", "list_hub"]

_GLOB_CHARS = frozenset("*?[")

# A listed file: (path at the commit, size, the listed base at the commit, version token).
HubFile = tuple[str, int, str, str]


def commit_details(protocol: str, paths: Iterable[str]) -> dict[str, str]:
    """A plan's details that pin the commit its Hub files were listed at: ``{"commit": sha}``
    (several commits, from several repositories: joined by commas); ``{}`` elsewhere."""
    if protocol != PROTOCOL:
        return {}
    commits = dict.fromkeys(c for c in (pinned_at_commit(p) for p in paths) if c)
    return {"commit": ",".join(commits)} if commits else {}


def list_hub(path: str, spec: HubAccess) -> list[HubFile]:
    """The files ``path`` (a file, a directory or a glob, without ``hf://``) names, at the
    commit its revision resolves to now; each path carries ``@<commit>``. One revision
    request and one listing (its pages), two for a path without glob characters that names a
    directory.

    Raises:
        StorageNotFoundError: the repository, revision or path does not exist.
        StoragePermissionError: the repository is private or gated and the token cannot read it.
        InvalidSourceError: a glob matched nothing, a directory holds no files.
    """
    hub = HubPath.parse(path)
    commit = resolve_commit(hub, spec)
    url = f"hf://{hub.at(commit, hub.inner)}"
    try:
        return _list_at(hub, commit, url, spec)
    except StorageNotFoundError as exc:  # (a folder of the path is missing: name the path)
        raise StorageNotFoundError(f"{url}: not found at commit {commit} of {hub.label}") from exc


def _list_at(hub: HubPath, commit: str, url: str, spec: HubAccess) -> list[HubFile]:
    """`list_hub`'s files, at ``commit`` (``url``: the path there, for messages)."""
    inner = hub.inner
    if _GLOB_CHARS & set(inner):
        from fsspec.utils import glob_translate

        base = _glob_base(inner)
        matches = re.compile(glob_translate(inner)).match
        found = [e for e in _tree(hub, commit, base, spec, recursive=True) if matches(e["path"])]
        files = _files(hub, commit, base, found)
        if not files:
            raise InvalidSourceError(f"{url}: the pattern matched no files")
        return files
    parent = inner.rpartition("/")[0]
    entries = _tree(hub, commit, parent, spec, recursive=False) if inner else []
    entry = next((e for e in entries if e["path"] == inner), None)
    if inner and entry is None:
        raise StorageNotFoundError(f"no entry {inner!r}")
    if entry is not None and entry.get("type") == "file":
        return _files(hub, commit, parent, [entry], hidden=True)
    files = _files(hub, commit, inner, _tree(hub, commit, inner, spec, recursive=True))
    if not files:
        raise InvalidSourceError(f"{url}: the directory holds no data files")
    return files


def _tree(
    hub: HubPath, commit: str, base: str, spec: HubAccess, *, recursive: bool
) -> list[dict[str, Any]]:
    """The entries under ``base`` at ``commit``, every page."""
    first = f"{endpoint(spec)}/api/{hub.kind}/{hub.repo}/tree/{commit}"
    url: str | None = f"{first}/{quote(base)}" if base else first
    params: dict[str, str] | None = {"recursive": str(recursive).lower(), "expand": "false"}
    entries: list[dict[str, Any]] = []
    while url is not None:
        response = send(spec, url, what=f"{hub.label} tree {base or '/'}", params=params)
        check_answer(response, hub, f"hf://{hub.at(commit, base)}")
        entries.extend(response.json())
        url = response.links.get("next", {}).get("url")
        params = None  # (the next page's link carries them)
    return entries


def _files(
    hub: HubPath, commit: str, base: str, entries: list[dict[str, Any]], *, hidden: bool = False
) -> list[HubFile]:
    """The file ``entries`` as listed files under ``base``, sorted, hidden ones left out
    (unless ``hidden``: a file named explicitly), versioned by their LFS sha256 or blob id."""
    cut = len(base) + 1 if base else 0
    files = []
    for e in entries:
        relative = e["path"][cut:]
        if e.get("type") != "file" or (not hidden and _is_hidden(relative)):
            continue
        lfs = e.get("lfs") or {}
        version = f"sha256={lfs['oid']}" if lfs.get("oid") else f"oid={e.get('oid', '')}"
        size = int(e.get("size") or lfs.get("size") or 0)
        files.append((hub.at(commit, e["path"]), size, hub.at(commit, base), version))
    return sorted(files)


def _is_hidden(relative: str) -> bool:
    """As `listing`'s: a part starting with ``.`` or ``_`` (``.gitattributes``)."""
    return any(part.startswith((".", "_")) for part in relative.split("/") if part)


def _glob_base(pattern: str) -> str:
    """The directories of ``pattern`` before its first glob character."""
    parts = pattern.split("/")
    cut = next(i for i, part in enumerate(parts) if _GLOB_CHARS & set(part))
    return "/".join(parts[:cut])
