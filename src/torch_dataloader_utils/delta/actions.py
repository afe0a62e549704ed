"""The deletion vector descriptors of a Delta version's live files, read from the log itself.

deltalake replays the log and says which files are live at the version, but does not hand out
their add actions' ``deletionVector`` descriptors; they are read here: a live file's descriptor
is the one of its latest add action at or before the version, found in the commits after the
newest complete checkpoint (read newest first), else in that checkpoint (classic, multi-part,
or v2 with its sidecars). Only tables whose protocol has deletion vectors are read so.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Iterator, Mapping
from typing import Any
from urllib.parse import unquote

import pyarrow.parquet as pq

from ..errors import CorruptFileError
from ..formats.opening import open_input, parsing
from ..fs import FileSystemSpec
from ..sources.deletion_vectors import DeltaDeletionVector

__all__ = ["deletion_vectors", "log_path"]

_CHECKPOINT = re.compile(
    r"^(\d{20})\.checkpoint(?:\.(\d{10})\.(\d{10})\.parquet|\.parquet|\.[0-9a-fA-F-]{36}\.(json|parquet))$"
)
_SIDECARS = "_sidecars"


def log_path(path: str) -> str:
    """An add action's path as a key: its decoded form (the log URL-encodes paths)."""
    return unquote(path)


def _descriptor(dv: Mapping[str, Any] | None) -> DeltaDeletionVector | None:
    if not dv or dv.get("storageType") is None:
        return None
    offset = dv.get("offset")
    return DeltaDeletionVector(
        storage_type=str(dv["storageType"]),
        path_or_inline=str(dv["pathOrInlineDv"]),
        offset=None if offset is None else int(offset),
        size=int(dv["sizeInBytes"]),
        cardinality=int(dv["cardinality"]),
    )


def _checkpoint(names: Iterable[str], version: int) -> list[str]:
    """The files of the newest complete checkpoint at or before ``version`` (``[]``: none)."""
    found: dict[int, dict[str, Any]] = {}
    for name in names:
        m = _CHECKPOINT.match(name)
        if m is None or int(m.group(1)) > version:
            continue
        entry = found.setdefault(int(m.group(1)), {"parts": {}, "single": None})
        if m.group(2):  # multi-part: complete when every part is there
            entry["parts"][int(m.group(2))] = (name, int(m.group(3)))
        else:
            entry["single"] = name
    for v in sorted(found, reverse=True):
        entry = found[v]
        if entry["single"]:
            return [entry["single"]]
        parts = entry["parts"]
        total = next(iter(parts.values()))[1]
        if len(parts) == total:
            return [parts[i][0] for i in sorted(parts)]
    return []


def _commit_adds(text: str, where: str) -> Iterator[tuple[str, Mapping[str, Any]]]:
    for line in text.splitlines():
        if not line.strip():
            continue
        try:
            action = json.loads(line)
        except ValueError as exc:
            raise CorruptFileError(f"{where}: a line is not JSON ({exc})") from exc
        add = action.get("add")
        if add:
            yield add["path"], add


def _parquet_adds(path: str, fs: FileSystemSpec) -> tuple[list[tuple[str, Any]], list[str]]:
    """The adds (path, deletionVector) of a Parquet checkpoint or sidecar, and its sidecars."""
    with open_input(path, fs) as source, parsing(fs.url(path)):
        schema = pq.read_schema(source)
        columns = [c for c in ("add", "sidecar") if c in schema.names]
        source.seek(0)
        table = pq.read_table(source, columns=columns)
    adds = []
    if "add" in columns:
        for add in table.column("add").to_pylist():
            if add:
                adds.append((add["path"], add.get("deletionVector")))
    sidecars = []
    if "sidecar" in columns:
        sidecars = [s["path"] for s in table.column("sidecar").to_pylist() if s]
    return adds, sidecars


def _json_adds(path: str, fs: FileSystemSpec) -> tuple[list[tuple[str, Any]], list[str]]:
    with open_input(path, fs) as source:
        text = source.read().decode()
    adds = [(p, a.get("deletionVector")) for p, a in _commit_adds(text, fs.url(path))]
    sidecars = []
    for line in text.splitlines():
        if '"sidecar"' in line:
            sidecar = json.loads(line).get("sidecar")
            if sidecar:
                sidecars.append(sidecar["path"])
    return adds, sidecars


def _checkpoint_adds(log: str, files: list[str], fs: FileSystemSpec) -> Iterator[tuple[str, Any]]:
    for name in files:
        read = _json_adds if name.endswith(".json") else _parquet_adds
        adds, sidecars = read(f"{log}/{name}", fs)
        yield from adds
        for sidecar in sidecars:
            where = sidecar if "/" in sidecar else f"{log}/{_SIDECARS}/{sidecar}"
            yield from _parquet_adds(fs.strip(where), fs)[0]


def deletion_vectors(
    root: str, fs: FileSystemSpec, version: int, live: Iterable[str]
) -> dict[str, DeltaDeletionVector]:
    """The deletion vectors of ``live`` files (their add actions' paths) at ``version``, by
    decoded path; files without one are left out.

    Raises:
        CorruptFileError: a commit or checkpoint cannot be parsed.
        StorageError: a log file cannot be read.
    """
    wanted = {log_path(p) for p in live}
    found: dict[str, DeltaDeletionVector | None] = {}
    log = f"{root}/_delta_log"
    names = [str(n).rsplit("/", 1)[-1] for n in fs.fsspec().ls(log, detail=False)]
    checkpoint = _checkpoint(names, version)
    first = int(checkpoint[0][:20]) + 1 if checkpoint else 0
    for v in range(version, first - 1, -1):
        if len(found) == len(wanted):
            break
        path = f"{log}/{v:020d}.json"
        with open_input(path, fs) as source:
            text = source.read().decode()
        for add_path, add in _commit_adds(text, fs.url(path)):
            key = log_path(add_path)
            if key in wanted and key not in found:
                found[key] = _descriptor(add.get("deletionVector"))
    if len(found) < len(wanted) and checkpoint:
        for add_path, dv in _checkpoint_adds(log, checkpoint, fs):
            key = log_path(add_path)
            if key in wanted and key not in found:
                found[key] = _descriptor(dv)
    return {k: v for k, v in found.items() if v is not None}
