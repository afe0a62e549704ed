"""The plan: the canonical list of chunks a source is read as, and its fingerprint."""

from __future__ import annotations

import hashlib
import json
import posixpath
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa

from .chunks import Chunk, Chunks, Files

__all__ = ["Chunk", "Chunks", "Files", "Plan", "portable_schema"]


def portable_schema(schema: pa.Schema) -> pa.Schema:
    """``schema`` in the form that pickle and Arrow IPC give back unchanged, so that a plan is
    the same made in one process, on N ranks, kept in ``cache_dir`` or pickled into a worker
    (docs/adr/0027-one-plan-on-every-path.md).

    Pickle names a fixed-size list's child ``item`` (its nullability and metadata dropped) and
    a map's entries ``entries`` (``keys_sorted`` dropped); IPC names a map's entries
    ``entries`` and its fields ``key`` and ``value``. Those are the names given here, at any
    depth. A schema with neither type is returned as it is, so its fingerprint is unchanged.
    """
    if not any(_renamed_inside(f.type) for f in schema):
        return schema
    return pa.schema([_portable_field(f) for f in schema], metadata=schema.metadata)


def _renamed_inside(t: pa.DataType) -> bool:
    """Whether ``t`` holds a fixed-size list or a map (whose children pickle renames)."""
    if pa.types.is_fixed_size_list(t) or pa.types.is_map(t):
        return True
    if pa.types.is_dictionary(t):
        return _renamed_inside(t.value_type)
    return any(_renamed_inside(t.field(i).type) for i in range(t.num_fields))


def _portable_field(f: pa.Field) -> pa.Field:
    return f.with_type(_portable(f.type)) if _renamed_inside(f.type) else f


# Variable-size lists: pickle and IPC keep their child field whole.
_LISTS = (
    (pa.types.is_list, pa.list_),
    (pa.types.is_large_list, pa.large_list),
    (pa.types.is_list_view, pa.list_view),
    (pa.types.is_large_list_view, pa.large_list_view),
)


def _portable(t: pa.DataType) -> pa.DataType:
    """`portable_schema` of one type (extension types are kept: pickle keeps their storage)."""
    if pa.types.is_fixed_size_list(t):
        return pa.list_(_portable(t.value_type), t.list_size)
    if pa.types.is_map(t):
        key = _portable_field(t.key_field).with_name("key")
        return pa.map_(key, _portable_field(t.item_field).with_name("value"))
    for kind, make in _LISTS:
        if kind(t):
            return make(_portable_field(t.value_field))
    if pa.types.is_struct(t):
        return pa.struct([_portable_field(t.field(i)) for i in range(t.num_fields)])
    if pa.types.is_union(t):
        fields = [_portable_field(t.field(i)) for i in range(t.num_fields)]
        return pa.union(fields, t.mode, list(t.type_codes))
    if pa.types.is_dictionary(t):
        return pa.dictionary(t.index_type, _portable(t.value_type), t.ordered)
    if pa.types.is_run_end_encoded(t):
        return pa.run_end_encoded(t.run_end_type, _portable(t.value_type))
    return t


def _common_folder(paths: list[str]) -> str:
    """The deepest folder that holds every path ("" when they share none)."""
    if not paths:
        return ""
    folders = {posixpath.dirname(p) for p in paths}
    try:
        return posixpath.commonpath(sorted(folders))
    except ValueError:  # absolute and relative paths mixed
        return ""


def _relative(paths: list[str]) -> list[str]:
    """``paths`` relative to their common folder: data moved or copied elsewhere (another mount,
    a bucket) still resumes; renamed, added or rewritten files do not."""
    root = _common_folder(paths)
    if not root:
        return list(paths)
    # Stripping the folder gives what posixpath.relpath gives for the normalised paths listing
    # returns, faster (docs/adr/0020-measurements-behind-constants.md#paths-and-listings).
    prefix = root if root.endswith("/") else root + "/"
    cut = len(prefix)
    return [
        p[cut:] if p.startswith(prefix) and _plain(p[cut:]) else posixpath.relpath(p, root)
        for p in paths
    ]


# A string as json.dumps writes it (ASCII, escaped): its own C encoder.
_json_string = json.encoder.encode_basestring_ascii


def _plain(relative: str) -> bool:
    """Whether ``relative`` has no path component that normalising changes (``.``, ``..``,
    empty); a folder named ``.data`` is plain."""
    if "/." not in relative and "//" not in relative and not relative.startswith("."):
        return True  # (the common case, no component to look at)
    return all(name not in {".", "..", ""} for name in relative.split("/"))


def _parquet_read(schema: pa.Schema) -> pa.Schema | None:
    """``schema`` as pyarrow reads it back from a Parquet file (a fixed-size list's child named
    ``element``, a map's entries after its field), where that renames anything, else None."""
    if not any(_renamed_inside(f.type) for f in schema):
        return None
    import pyarrow.parquet as pq  # (only for a state saved before portable schemas)

    sink = pa.BufferOutputStream()
    try:
        pq.write_table(schema.empty_table(), sink)
        return pq.read_schema(pa.BufferReader(sink.getvalue()))
    except pa.ArrowException:  # a type Parquet does not store: never planned from Parquet
        return None


@dataclass(frozen=True, eq=False)
class Plan:
    """Chunks in canonical order (files sorted as listed, natural order inside each file).

    Attributes:
        chunks: the chunks, as columns (`Chunks`: a sequence of `Chunk`; a sequence of `Chunk`
            objects given here is converted).
        schema: the schema of the batches the dataset yields (projection and partition columns
            applied), in its portable form (`portable_schema`: a fixed-size list's child is
            ``item``, a map's entries ``entries``, whatever the files say).
        row_bytes: estimated decoded bytes per row of the projected columns (sizes shuffle
            blocks).
        details: what else identifies the read (format, columns, filter), for the fingerprint.
        filtered_rows: rows of each chunk that pass the row filter, counted at plan time
            (``None`` without a filter).
        files: each file's identity as listed (size, version token; see `fs.identity`),
            checked when the file is read (empty: none pinned); `Files` columns.
        files_digest: a digest of ``files``: a state saved for other versions of the files is
            refused (kept apart from the fingerprint, so states saved before it existed resume).
        fingerprint: identifies the plan's structure and the read: a state from another plan
            is refused.
    """

    chunks: Chunks
    schema: pa.Schema
    row_bytes: float
    details: tuple[tuple[str, str], ...] = ()
    filtered_rows: Sequence[int] | None = None
    files: Mapping[str, tuple[int, str]] = field(default_factory=dict)
    files_digest: str = field(init=False)
    fingerprint: str = field(init=False)

    def __post_init__(self) -> None:
        chunks = Chunks.of(self.chunks)
        object.__setattr__(self, "chunks", chunks)
        object.__setattr__(self, "schema", portable_schema(self.schema))
        object.__setattr__(self, "files", Files.of(self.files))
        if self.filtered_rows is not None:
            filtered = np.array(self.filtered_rows, dtype=np.int64)
            filtered.flags.writeable = False
            object.__setattr__(self, "filtered_rows", filtered)
        paths = sorted(self.files)
        names = _relative(paths)
        object.__setattr__(self, "files_digest", self._files_digest(paths, names))
        object.__setattr__(self, "fingerprint", self._columnar(self.schema, (paths, names)))

    def _columnar(
        self, schema: pa.Schema, relative: tuple[list[str], list[str]] | None = None
    ) -> str:
        """The fingerprint over the chunks' columns, with ``schema`` for the plan's
        (``relative``: paths and their `_relative` names already made, used if the chunks'
        files are those paths)."""
        chunks = self.chunks
        digest = hashlib.sha256(b"plan/2")
        digest.update(json.dumps(self.details).encode())
        digest.update(schema.to_string(show_schema_metadata=False).encode())
        paths = chunks.paths
        names = relative[1] if relative and paths == relative[0] else _relative(paths)
        digest.update(json.dumps(names).encode())
        for name in ("file", "start", "stop", "num_rows", "unit_offsets", "unit_rows"):
            digest.update(np.ascontiguousarray(chunks.column(name), "<i8").tobytes())
        if self.filtered_rows is not None:
            digest.update(np.ascontiguousarray(self.filtered_rows, "<i8").tobytes())
        return digest.hexdigest()[:16]

    def _files_digest(self, paths: list[str], names: list[str]) -> str:
        """The digest of the files (``paths``, sorted, and their `_relative` ``names``): a JSON
        array ``[name, size, version]`` a file, the bytes ``json.dumps`` gives (states saved
        before still match), written in one pass (a ``json.dumps`` a file was half of it:
        docs/benchmarks.md#planning-20000-files)."""
        files = self.files
        records = [
            f"[{_json_string(name)}, {int(size)}, {_json_string(version)}]"
            for name, (size, version) in zip(names, map(files.__getitem__, paths), strict=True)
        ]
        return hashlib.sha256("".join(records).encode()).hexdigest()[:16]

    def legacy_fingerprint(self) -> str:
        """The fingerprint as versions before 0.3.0.dev1 computed it (one JSON record per chunk),
        so that states they saved still resume. Computed when asked (slow on big plans)."""
        return self._chunkwise(self.schema)

    def _chunkwise(self, schema: pa.Schema) -> str:
        digest = hashlib.sha256()
        digest.update(json.dumps(self.details).encode())
        digest.update(schema.to_string(show_schema_metadata=False).encode())
        root = _common_folder(self.chunks.paths)
        for c in self.chunks:
            name = posixpath.relpath(c.path, root) if root else c.path
            digest.update(
                json.dumps([name, c.start, c.stop, c.num_rows, list(c.unit_rows)]).encode()
            )
        if self.filtered_rows is not None:
            digest.update(json.dumps([int(n) for n in self.filtered_rows]).encode())
        return digest.hexdigest()[:16]

    def earlier_fingerprints(self) -> Iterator[str]:
        """The fingerprints earlier versions computed for this plan, so that states they saved
        still resume: chunk by chunk (`legacy_fingerprint`), and, for a Parquet source with
        fixed-size lists or maps, over the schema as pyarrow's Parquet reader names their
        children (one process planned with it before the plan's schema was `portable_schema`).
        Computed when asked, one at a time."""
        yield self.legacy_fingerprint()
        read = _parquet_read(self.schema) if dict(self.details).get("format") == "parquet" else None
        if read is not None:
            yield self._columnar(read)
            yield self._chunkwise(read)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Plan):
            return NotImplemented
        return (self.fingerprint, self.files_digest) == (other.fingerprint, other.files_digest)

    def __hash__(self) -> int:
        return hash((self.fingerprint, self.files_digest))

    @property
    def num_rows(self) -> int:
        """Rows the plan yields per epoch (after the row filter), before any remainder policy."""
        return int(self.chunk_rows.sum())

    @property
    def chunk_rows(self) -> np.ndarray:
        """Rows of every chunk that are read (after the row filter), in plan order (read-only)."""
        if self.filtered_rows is not None:
            return np.asarray(self.filtered_rows)
        return self.chunks.num_rows

    def summary(self) -> str:
        """One line for the log."""
        return (
            f"plan {self.fingerprint}: {len(self.chunks.paths)} files, {len(self.chunks)} "
            f"chunks, {self.num_rows} rows, {len(self.schema)} columns"
        )

    @staticmethod
    def details_of(**items: object) -> tuple[tuple[str, str], ...]:
        """Normalise fingerprint details to sorted string pairs."""
        return tuple(sorted((k, str(v)) for k, v in items.items()))
