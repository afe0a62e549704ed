"""Chunks and file identities as columns: a plan of a million chunks is a few arrays, not a
million Python objects.

A million Python `Chunk` objects took seconds to pickle and unpickle on every rank and hundreds of
MB in every process (docs/adr/0020-measurements-behind-constants.md#chunks-as-columns). As columns
the same plan is a few numpy arrays: built, fingerprinted and sliced in vectorised code, pickled as
their bytes (`planning.arrays`: a spawned DataLoader worker gets one shared-memory buffer).

`Chunks` is a sequence of `Chunk`: ``plan.chunks[i]`` is a `Chunk` made on demand.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, overload

import numpy as np

from .arrays import NamedArrays, smallest, strings

__all__ = ["Chunk", "Chunks", "Files"]


@dataclass(frozen=True, slots=True)
class Chunk:
    """What planning cuts a file into: a file plus a range of its native units.

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


class Chunks(Sequence[Chunk]):
    """The plan's chunks as columns; a sequence of `Chunk` (each made when asked for).

    Build with `Chunks.of` (from `Chunk` objects, as formats plan them) or `Chunks.from_arrays`
    (vectorised, for plans built as arrays).
    """

    __slots__ = ("_columns", "_derived", "_partitions", "_paths")

    def __init__(self, columns: NamedArrays, partitions: tuple[tuple[tuple[str, Any], ...], ...]):
        self._columns = columns  # each in the smallest integer type that holds it
        self._partitions = partitions  # distinct partitions; a chunk holds an index
        self._paths: list[str] | None = None  # decoded file paths, per process
        self._derived: dict[str, np.ndarray] = {}  # int64 columns, per process

    @classmethod
    def of(cls, chunks: Iterable[Chunk]) -> Chunks:
        """The chunks as columns (``chunks`` already `Chunks`: itself)."""
        if isinstance(chunks, Chunks):
            return chunks
        chunks = list(chunks)
        paths: dict[str, int] = {}
        partitions: dict[tuple[tuple[str, Any], ...], int] = {}
        file = [paths.setdefault(c.path, len(paths)) for c in chunks]
        partition = [partitions.setdefault(c.partition, len(partitions)) for c in chunks]
        units = [c.unit_rows for c in chunks]
        return cls.from_arrays(
            paths=list(paths),
            file=np.asarray(file, np.int64),
            start=np.asarray([c.start for c in chunks], np.int64),
            stop=np.asarray([c.stop for c in chunks], np.int64),
            num_rows=np.asarray([c.num_rows for c in chunks], np.int64),
            num_bytes=np.asarray([c.num_bytes for c in chunks], np.int64),
            unit_rows=units,
            partitions=list(partitions),
            partition=np.asarray(partition, np.int64),
        )

    @classmethod
    def from_arrays(
        cls,
        *,
        paths: Sequence[str],
        file: np.ndarray,
        start: np.ndarray,
        stop: np.ndarray,
        num_rows: np.ndarray,
        num_bytes: np.ndarray,
        unit_rows: Sequence[Sequence[int]] | np.ndarray | None = None,
        unit_offsets: np.ndarray | None = None,
        partitions: Sequence[tuple[tuple[str, Any], ...]] = ((),),
        partition: np.ndarray | None = None,
    ) -> Chunks:
        """Chunks from columns: chunk ``i`` is rows of ``paths[file[i]]``, native units
        ``[start[i], stop[i])``. Each chunk's native units' rows are given either per chunk
        (``unit_rows`` a sequence of sequences) or flat (``unit_rows`` one array of every native
        unit's rows, with ``unit_offsets``, ``len(file) + 1`` bounds into it)."""
        n = len(file)
        if unit_offsets is not None:
            if unit_rows is None or len(unit_offsets) != n + 1:
                raise ValueError("unit_offsets needs unit_rows and len(file) + 1 bounds")
            unit_offsets = np.asarray(unit_offsets, np.int64)
            unit_values = np.asarray(unit_rows, np.int64)
        elif unit_rows is None:
            unit_offsets, unit_values = np.zeros(n + 1, np.int64), np.zeros(0, np.int64)
        else:
            lengths = np.fromiter((len(u) for u in unit_rows), np.int64, count=n)
            unit_offsets = np.zeros(n + 1, np.int64)
            np.cumsum(lengths, out=unit_offsets[1:])
            unit_values = np.fromiter(
                (r for u in unit_rows for r in u), np.int64, count=int(unit_offsets[-1])
            )
        path_data, path_offsets = strings(paths)
        if partition is None:
            partition = np.zeros(n, np.int64)
        columns = NamedArrays(
            {
                "file": smallest(np.asarray(file)),
                "start": smallest(np.asarray(start)),
                "stop": smallest(np.asarray(stop)),
                "num_rows": smallest(np.asarray(num_rows)),
                "num_bytes": smallest(np.asarray(num_bytes)),
                "unit_count": smallest(np.diff(unit_offsets)),
                "unit_rows": smallest(unit_values),
                "partition": smallest(np.asarray(partition)),
                "path_data": path_data,
                "path_offsets": smallest(path_offsets),
            }
        )
        return cls(columns, tuple(partitions))

    @classmethod
    def concat(cls, parts: Sequence[Chunks]) -> Chunks:
        """The chunks of ``parts`` one after another (a mixture's sources), column by column."""
        paths: list[str] = []
        partitions: list[tuple[tuple[str, Any], ...]] = []
        columns: dict[str, list[np.ndarray]] = {
            name: [] for name in ("file", "start", "stop", "num_rows", "num_bytes", "partition")
        }
        counts: list[np.ndarray] = []
        units: list[np.ndarray] = []
        for part in parts:
            for name, shift in (("file", len(paths)), ("partition", len(partitions))):
                columns[name].append(part.column(name) + shift)
            for name in ("start", "stop", "num_rows", "num_bytes"):
                columns[name].append(part.column(name))
            counts.append(np.diff(part.column("unit_offsets")))
            units.append(part.column("unit_rows"))
            paths.extend(part.paths)
            partitions.extend(part._partitions)
        joined = {n: np.concatenate(c) if c else np.zeros(0, np.int64) for n, c in columns.items()}
        offsets = np.zeros(len(joined["file"]) + 1, np.int64)
        if counts:
            np.cumsum(np.concatenate(counts), out=offsets[1:])
        return cls.from_arrays(
            paths=paths,
            unit_offsets=offsets,
            unit_rows=np.concatenate(units) if units else np.zeros(0, np.int64),
            partitions=partitions or [()],
            **joined,
        )

    # --- columns ----------------------------------------------------------------------------

    def column(self, name: str) -> np.ndarray:
        """A column as int64 (read-only): ``file``, ``start``, ``stop``, ``num_rows``,
        ``num_bytes``, ``partition``; ``unit_offsets`` (``len + 1``) and ``unit_rows`` hold each
        chunk's native units' rows."""
        found = self._derived.get(name)
        if found is None:
            arrays = self._columns.arrays
            if name == "unit_offsets":
                found = np.zeros(len(self) + 1, np.int64)
                np.cumsum(arrays["unit_count"], out=found[1:])
            else:
                found = arrays[name].astype(np.int64)
            found.flags.writeable = False
            self._derived[name] = found
        return found

    @property
    def num_rows(self) -> np.ndarray:
        """Rows of each chunk (before any row filter)."""
        return self.column("num_rows")

    @property
    def paths(self) -> list[str]:
        """The distinct files, in order of first appearance."""
        if self._paths is None:
            arrays = self._columns.arrays
            data, offsets = arrays["path_data"], arrays["path_offsets"]
            text = bytes(data)
            ends = offsets.tolist()
            self._paths = [
                text[a:b].decode("utf-8", "surrogateescape") for a, b in itertools.pairwise(ends)
            ]
        return self._paths

    def nbytes(self) -> int:
        """Bytes the columns take."""
        return sum(int(a.nbytes) for a in self._columns.arrays.values())

    # --- the sequence -----------------------------------------------------------------------

    def __len__(self) -> int:
        return len(self._columns.arrays["file"])

    @overload
    def __getitem__(self, index: int) -> Chunk: ...

    @overload
    def __getitem__(self, index: slice) -> Chunks: ...

    def __getitem__(self, index: int | slice) -> Chunk | Chunks:
        if isinstance(index, slice):
            return Chunks.of([self[i] for i in range(*index.indices(len(self)))])
        n = len(self)
        if index < 0:
            index += n
        if not 0 <= index < n:
            raise IndexError(f"chunk {index} of {n}")
        a = self._columns.arrays
        offsets = self.column("unit_offsets")
        lo, hi = int(offsets[index]), int(offsets[index + 1])
        return Chunk(
            self.paths[int(a["file"][index])],
            int(a["start"][index]),
            int(a["stop"][index]),
            int(a["num_rows"][index]),
            int(a["num_bytes"][index]),
            tuple(a["unit_rows"][lo:hi].tolist()),
            self._partitions[int(a["partition"][index])],
        )

    def __iter__(self) -> Iterator[Chunk]:
        return (self[i] for i in range(len(self)))

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Chunks):
            mine, theirs = self._columns.arrays, other._columns.arrays
            return (
                self.paths == other.paths
                and self._partitions == other._partitions
                and all(np.array_equal(mine[k], theirs[k]) for k in mine)
            )
        if isinstance(other, Sequence):
            return len(self) == len(other) and all(a == b for a, b in zip(self, other, strict=True))
        return NotImplemented

    def __hash__(self) -> int:
        return hash((len(self), tuple(self.paths[:8])))

    def __repr__(self) -> str:
        return f"Chunks({len(self)} chunks of {len(self.paths)} files)"

    def __getstate__(self) -> tuple[NamedArrays, tuple[tuple[tuple[str, Any], ...], ...]]:
        return self._columns, self._partitions

    def __setstate__(
        self, state: tuple[NamedArrays, tuple[tuple[tuple[str, Any], ...], ...]]
    ) -> None:
        self._columns, self._partitions = state
        self._paths, self._derived = None, {}


class Files(Mapping[str, tuple[int, str]]):
    """Each listed file's identity as pinned by the plan, ``path → (size, version)``, as
    columns (a lookup builds its index once per process)."""

    __slots__ = ("_columns", "_index", "_versions")

    def __init__(self, columns: NamedArrays) -> None:
        self._columns = columns
        self._index: dict[str, int] | None = None  # path -> position, per process
        self._versions = b""  # the versions' text, made with the index

    @classmethod
    def of(cls, files: Mapping[str, tuple[int, str]]) -> Files:
        """The identities as columns (``files`` already `Files`: itself)."""
        if isinstance(files, Files):
            return files
        paths = list(files)
        path_data, path_offsets = strings(paths)
        version_data, version_offsets = strings([files[p][1] for p in paths])
        return cls(
            NamedArrays(
                {
                    "path_data": path_data,
                    "path_offsets": smallest(path_offsets),
                    "size": np.asarray([files[p][0] for p in paths], np.int64),
                    "version_data": version_data,
                    "version_offsets": smallest(version_offsets),
                }
            )
        )

    def _paths(self) -> dict[str, int]:
        if self._index is None:
            a = self._columns.arrays
            text, ends = bytes(a["path_data"]), a["path_offsets"].tolist()
            self._index = {
                text[lo:hi].decode("utf-8", "surrogateescape"): i
                for i, (lo, hi) in enumerate(itertools.pairwise(ends))
            }
            self._versions = bytes(a["version_data"])  # (a slice of bytes: a reader's lookup)
        return self._index

    def __getitem__(self, path: str) -> tuple[int, str]:
        i = self._paths()[path]
        a = self._columns.arrays
        offsets = a["version_offsets"]
        version = self._versions[offsets.item(i) : offsets.item(i + 1)]
        return a["size"].item(i), version.decode("utf-8", "surrogateescape")

    def __iter__(self) -> Iterator[str]:
        return iter(self._paths())

    def __len__(self) -> int:
        return len(self._columns.arrays["size"])

    def __getstate__(self) -> NamedArrays:
        return self._columns

    def __setstate__(self, state: NamedArrays) -> None:
        self._columns, self._index, self._versions = state, None, b""
