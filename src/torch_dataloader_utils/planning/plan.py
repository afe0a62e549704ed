"""The plan: the canonical list of chunks a source is read as, and its fingerprint."""

from __future__ import annotations

import hashlib
import json
import posixpath
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa

__all__ = ["Chunk", "Plan"]


def _common_folder(paths: list[str]) -> str:
    """The deepest folder that holds every path ("" when they share none)."""
    if not paths:
        return ""
    folders = {posixpath.dirname(p) for p in paths}
    try:
        return posixpath.commonpath(sorted(folders))
    except ValueError:  # absolute and relative paths mixed
        return ""


@dataclass(frozen=True, slots=True)
class Chunk:
    """The planned unit: a file plus a format-native range of it.

    Attributes:
        path: the file, without protocol.
        start: first native unit (Parquet row group, ORC stripe, ...) of the range.
        stop: one past the last native unit.
        num_rows: rows in the range before any row filter.
        num_bytes: bytes to read for the projected columns (used for balancing).
        unit_rows: rows of each native unit in ``[start, stop)``, so a reader can seek to a row.
        partition: ``(key, value)`` pairs of hive partition columns for this file.
    """

    path: str
    start: int
    stop: int
    num_rows: int
    num_bytes: int
    unit_rows: tuple[int, ...] = ()
    partition: tuple[tuple[str, Any], ...] = ()


@dataclass(frozen=True)
class Plan:
    """Chunks in canonical order (files sorted as listed, natural order inside each file).

    Attributes:
        chunks: the chunks.
        schema: the schema of the batches the dataset yields (projection and partition columns
            applied).
        row_bytes: estimated decoded bytes per row of the projected columns (sizes shuffle
            blocks).
        details: what else identifies the read (format, columns, filter), for the fingerprint.
        filtered_rows: rows of each chunk that pass the row filter, counted at plan time
            (``None`` without a filter).
        files: each file's identity as listed (size, version token; see `fs.identity`),
            checked when the file is read (empty: none pinned).
        files_digest: a digest of ``files``: a state saved for other versions of the files is
            refused (kept apart from the fingerprint, so states saved before it existed resume).
        fingerprint: identifies the plan's structure and the read: a state from another plan
            is refused.
    """

    chunks: tuple[Chunk, ...]
    schema: pa.Schema
    row_bytes: float
    details: tuple[tuple[str, str], ...] = ()
    filtered_rows: tuple[int, ...] | None = None
    files: Mapping[str, tuple[int, str]] = field(default_factory=dict)
    files_digest: str = field(init=False)
    fingerprint: str = field(init=False)

    def __post_init__(self) -> None:
        digest = hashlib.sha256()
        digest.update(json.dumps(self.details).encode())
        digest.update(self.schema.to_string(show_schema_metadata=False).encode())
        # Paths relative to the files' common folder: data moved or copied elsewhere (another
        # mount, a bucket) still resumes; renamed, added or rewritten files do not.
        root = _common_folder([c.path for c in self.chunks])
        for c in self.chunks:
            name = posixpath.relpath(c.path, root) if root else c.path
            digest.update(
                json.dumps([name, c.start, c.stop, c.num_rows, list(c.unit_rows)]).encode()
            )
        if self.filtered_rows is not None:
            digest.update(json.dumps(list(self.filtered_rows)).encode())
        files = hashlib.sha256()
        root = _common_folder(list(self.files))
        for path, (size, version) in sorted(self.files.items()):
            name = posixpath.relpath(path, root) if root else path
            files.update(json.dumps([name, size, version]).encode())
        object.__setattr__(self, "files_digest", files.hexdigest()[:16])
        object.__setattr__(self, "fingerprint", digest.hexdigest()[:16])

    @property
    def num_rows(self) -> int:
        """Rows the plan yields per epoch (after the row filter), before any remainder policy."""
        return sum(self.chunk_rows)

    @property
    def chunk_rows(self) -> list[int]:
        """Rows of every chunk that are read (after the row filter), in plan order."""
        if self.filtered_rows is not None:
            return list(self.filtered_rows)
        return [c.num_rows for c in self.chunks]

    def summary(self) -> str:
        """One line for the log."""
        files = len({c.path for c in self.chunks})
        return (
            f"plan {self.fingerprint}: {files} files, {len(self.chunks)} chunks, "
            f"{self.num_rows} rows, {len(self.schema)} columns"
        )

    @staticmethod
    def details_of(**items: object) -> tuple[tuple[str, str], ...]:
        """Normalise fingerprint details to sorted string pairs."""
        return tuple(sorted((k, str(v)) for k, v in items.items()))
