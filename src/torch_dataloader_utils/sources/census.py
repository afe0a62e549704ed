"""The census: each chunk's rows after its source's transform, the tokens its tokenizer gives
them and (for a token budget) each row's length, counted once before epoch 0 and kept
(docs/concepts/census.md, docs/adr/0030-tokenizing-in-the-loader.md).

Planning needs only these counts to make a tokenized source's plan what a pre-tokenized one's
is: every token once, equal batches per rank, exact resume. Each rank takes the census of its
share of the chunks (`steps`), in threads over its cores (a tokenizer releases the GIL). Counts
are kept by chunk (`KeptCensus`), keyed by the file's identity, the chunk, the read, the
tokenizer's and transform's fingerprints and `CENSUS_VERSION`: in ``cache_dir`` and, when given,
a shared ``census_dir`` that other jobs and nodes read, so a restart or a second job with the
same tokenizer tokenizes nothing at planning.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import logging
import os
import threading
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa

from ..convert.arrow_values import list_lengths, null_marked
from ..errors import DataError
from ..formats import Format, ReadOptions
from ..formats.partitions import with_partition
from ..fs import FileSystemSpec
from ..fs.progress import Progress
from ..planning import Chunk
from ..tokenizing import Derivation
from .counting import in_threads

__all__ = [
    "CENSUS_FOLDER",
    "CENSUS_VERSION",
    "Census",
    "ChunkCensus",
    "KeptCensus",
    "census_counts",
    "take_census",
]

logger = logging.getLogger(__name__)

# The form of a chunk's counts; a change that would count otherwise bumps it (every kept
# census is then taken again).
CENSUS_VERSION = 1
CENSUS_FOLDER = f"tdu-census-v{CENSUS_VERSION}"
# New counts are written at least this often while a census runs, so that a census stopped
# half way keeps what it counted.
_WRITE_EVERY_S = 60.0


@dataclass(frozen=True)
class Census:
    """A source's census as one rank takes it: what the source computes from its rows, and
    the folders its counts are kept in. Each rank has its own (a tokenizer is never sent
    between ranks: it may not pickle, and every rank has it).

    Attributes:
        derive: the transform and tokenizer.
        folders: ``(filesystem, folder)`` of each place counts are kept (`KeptCensus`).
    """

    derive: Derivation
    folders: tuple[tuple[FileSystemSpec, str], ...] = ()


@dataclass(frozen=True)
class ChunkCensus:
    """One chunk's counts.

    Attributes:
        rows: rows after the filter and the transform.
        tokens: values of the token column (with `Tokenize.eos_token`'s).
        documents: rows whose token list is not null.
        lengths: each row's token count (a null list: -1), int32; ``None`` when not kept.
    """

    rows: int
    tokens: int
    documents: int
    lengths: np.ndarray | None = None


def chunk_key(chunk: Chunk, identity: tuple[int, str] | None, read: str, url: str) -> bytes:
    """What keys a chunk's census: its file's URL and identity, the units it spans, and the
    read (``read``: columns, filter, derivation)."""
    parts = [url, identity, chunk.start, chunk.stop, chunk.num_rows, chunk.partition, read]
    return hashlib.sha256(json.dumps(parts, default=str).encode()).digest()[:16]


class KeptCensus:
    """Chunks' counts kept in folders: ``cache_dir``'s and a shared ``census_dir``'s.

    Each folder holds parts (Arrow IPC files, each written whole and never changed), under the
    derivation's fingerprints. A part that cannot be read is left out (its chunks are counted
    again).
    """

    def __init__(self, folders: Sequence[tuple[FileSystemSpec, str]], derivation: Derivation):
        key = "-".join(f"{k}_{v}" for k, v in sorted(derivation.identity.items()))
        self.folders = [
            (fs, f"{fs.strip(path).rstrip('/')}/{CENSUS_FOLDER}/{key}") for fs, path in folders
        ]
        self._known: dict[bytes, ChunkCensus] | None = None
        self._lock = threading.Lock()

    def known(self) -> dict[bytes, ChunkCensus]:
        """Every chunk's counts the folders hold, by key (read once)."""
        with self._lock:
            if self._known is None:
                self._known = {}
                for fs, folder in self.folders:
                    self._known.update(_read_parts(fs, folder))
            return self._known

    def add(self, found: Mapping[bytes, ChunkCensus]) -> None:
        """Keep ``found`` in every folder (a part each; a folder that cannot be written is
        logged and passed over: the counts are in hand)."""
        if not found:
            return
        data = _part_bytes(found)
        name = f"part-{uuid.uuid4().hex}.arrow"
        for fs, folder in self.folders:
            try:
                _write(fs, folder, name, data)
            except OSError as exc:
                logger.warning("census: cannot keep counts in %s: %s", fs.url(folder), exc)
        with self._lock:
            if self._known is not None:
                self._known.update(found)


def take_census(
    chunks: Sequence[Chunk],
    fmt: Format,
    fs: FileSystemSpec,
    options: ReadOptions,
    derivation: Derivation,
    *,
    identities: Mapping[str, tuple[int, str]],
    column: str | None,
    lengths: bool,
    kept: KeptCensus | None,
    label: str,
) -> list[ChunkCensus]:
    """The census of ``chunks`` (read with ``options``: the columns the transform and tokenizer
    need, the filter): kept counts where ``kept`` holds them, the others counted now, in
    threads, and kept. ``column``: the token lists counted (the tokenizer's, or a column the
    transform leaves; ``None``: rows only); ``lengths``: each row's length is wanted too (a
    token budget's)."""
    read = json.dumps(
        [
            options.columns,
            None if options.filter is None else str(options.filter),
            derivation.identity,
            column,
            CENSUS_VERSION,
        ],
        default=str,
    )
    keys = [chunk_key(c, identities.get(c.path), read, fs.url(c.path)) for c in chunks]
    found: list[ChunkCensus | None] = [None] * len(chunks)
    if kept is not None:
        known = kept.known()
        for i, key in enumerate(keys):
            one = known.get(key)
            if one is not None and (one.lengths is not None or not lengths):
                found[i] = one
    todo = [i for i, one in enumerate(found) if one is None]
    if todo:
        logger.info("%s: census of %d chunks (%d kept)", label, len(todo), len(chunks) - len(todo))
        counted = _count(
            chunks,
            todo,
            keys,
            fmt=fmt,
            fs=fs,
            options=options,
            derivation=derivation,
            column=column,
            lengths=lengths,
            kept=kept,
            label=label,
        )
        for i in todo:
            found[i] = counted[keys[i]]
    return [one for one in found if one is not None]


def census_counts(
    chunks: Sequence[Chunk],
    fmt: Format,
    fs: FileSystemSpec,
    options: ReadOptions,
    census: Census,
    *,
    identities: Mapping[str, tuple[int, str]],
    tokens: str | None,
    eos: bool,
    lengths: str | None,
    rows: bool,
    label: str,
) -> tuple[list[int] | None, list[int] | None, list[np.ndarray] | None]:
    """What planning counts of ``chunks`` (files' or a table's), from the census: each chunk's
    rows (with ``rows``: a filter or a transform), a packed dataset's tokens (``tokens``: its
    column; one more a document with ``eos``), a token budget's rows' lengths (``lengths``:
    its column); each ``None`` where not asked."""
    derive = census.derive
    counted = take_census(
        chunks,
        fmt,
        fs,
        options,
        derive,
        identities=identities,
        column=derive.output or tokens or lengths,
        lengths=lengths is not None,
        kept=KeptCensus(census.folders, derive) if census.folders else None,
        label=label,
    )
    each_rows = [c.rows for c in counted] if rows else None
    each_tokens = None
    if tokens is not None:
        each_tokens = [c.tokens + (c.documents if eos else 0) for c in counted]
    each_lengths = None
    if lengths is not None:
        empty = np.zeros(0, np.int32)
        each_lengths = [c.lengths if c.lengths is not None else empty for c in counted]
    return each_rows, each_tokens, each_lengths


def census_threads() -> int:
    """Threads a rank counts with: its share of the node's cores (``LOCAL_WORLD_SIZE`` ranks
    share them)."""
    ranks = max(1, int(os.environ.get("LOCAL_WORLD_SIZE", "1") or 1))
    return max(1, (os.cpu_count() or 1) // ranks)


def _count(
    chunks: Sequence[Chunk],
    todo: Sequence[int],
    keys: Sequence[bytes],
    *,
    fmt: Format,
    fs: FileSystemSpec,
    options: ReadOptions,
    derivation: Derivation,
    column: str | None,
    lengths: bool,
    kept: KeptCensus | None,
    label: str,
) -> dict[bytes, ChunkCensus]:
    """Count the chunks at ``todo`` in threads, with progress (a bar on the first rank when
    tqdm is installed), the counts kept every `_WRITE_EVERY_S` seconds and at the end."""
    done: dict[bytes, ChunkCensus] = {}
    unsaved: dict[bytes, ChunkCensus] = {}
    lock = threading.Lock()
    progress = Progress(f"chunks counted by the census of {label}", len(todo))
    bar = _bar(len(todo), label)
    last = [time.monotonic()]

    def one(i: int, own: Format) -> None:
        counted = count_chunk(
            chunks[i], own, fs, options, derivation, column=column, lengths=lengths
        )
        progress.add()
        if bar is not None:
            bar.update(1)
        with lock:
            done[keys[i]] = unsaved[keys[i]] = counted
            due = time.monotonic() - last[0] >= _WRITE_EVERY_S
            if due:
                batch, last[0] = dict(unsaved), time.monotonic()
                unsaved.clear()
        if due and kept is not None:
            kept.add(batch)

    try:
        in_threads(todo, fmt, one, census_threads())
    finally:
        if bar is not None:
            bar.close()
        if kept is not None:
            kept.add(unsaved)
    progress.finish()
    return done


def count_chunk(
    chunk: Chunk,
    fmt: Format,
    fs: FileSystemSpec,
    options: ReadOptions,
    derivation: Derivation,
    *,
    column: str | None,
    lengths: bool,
) -> ChunkCensus:
    """One chunk's counts: its rows read whole, partition columns added, filtered, derived;
    the lists of ``column`` counted (with ``lengths``, each row's kept)."""
    where = f"{fs.url(chunk.path)} (chunk {chunk.start}:{chunk.stop})"
    rows = tokens = documents = 0
    each_row: list[np.ndarray] = []
    for raw in fmt.read(chunk, 0, chunk.num_rows, fs, options):
        batch = with_partition(raw, chunk.partition, options)
        if options.filter is not None:
            batch = batch.filter(options.filter)
        batch = derivation.transformed(batch, where)
        if column is not None and column == derivation.output:  # (rows alone: no tokens)
            batch = derivation.tokenized(batch, where)
        rows += batch.num_rows
        if column is not None:
            if column not in batch.schema.names:
                raise DataError(
                    f"{where}: the column {column!r} to count is not among the transform's "
                    f"columns {batch.schema.names}"
                )
            lists = batch.column(column)
            each = list_lengths(lists)
            tokens += int(each.sum())
            documents += len(lists) - lists.null_count
            if lengths:
                each_row.append(null_marked(lists))
    if not lengths:
        return ChunkCensus(rows, tokens, documents)
    joined = np.concatenate(each_row) if each_row else np.zeros(rows, np.int32)
    return ChunkCensus(rows, tokens, documents, joined)


def _bar(total: int, label: str) -> Any:
    """A tqdm bar with an ETA on the first rank (``None``: another rank, or no tqdm)."""
    if os.environ.get("RANK", "0") != "0" or total < 2:
        return None
    try:
        from tqdm.auto import tqdm
    except ImportError:
        return None
    # (disable=None: no bar where stderr is not a terminal, a log or CI)
    return tqdm(total=total, desc=f"census {label}", unit="chunk", leave=False, disable=None)


def _part_bytes(found: Mapping[bytes, ChunkCensus]) -> bytes:
    keys = list(found)
    values = [found[k] for k in keys]
    table = pa.table(
        {
            "key": pa.array(keys, pa.binary(16)),
            "rows": pa.array([v.rows for v in values], pa.int64()),
            "tokens": pa.array([v.tokens for v in values], pa.int64()),
            "documents": pa.array([v.documents for v in values], pa.int64()),
            "lengths": pa.array(
                [None if v.lengths is None else v.lengths for v in values], pa.list_(pa.int32())
            ),
        }
    )
    sink = io.BytesIO()
    with pa.ipc.new_file(sink, table.schema) as writer:
        writer.write_table(table)
    return sink.getvalue()


def _read_parts(fs: FileSystemSpec, folder: str) -> dict[bytes, ChunkCensus]:
    """Every count the parts in ``folder`` hold (none: no folder)."""
    store = fs.fsspec()
    try:
        names = sorted(p for p in store.ls(folder, detail=False) if p.endswith(".arrow"))
    except (FileNotFoundError, OSError):
        return {}
    found: dict[bytes, ChunkCensus] = {}
    for name in names:
        try:
            table = pa.ipc.open_file(pa.BufferReader(store.cat_file(name))).read_all()
            columns = table.to_pydict()
        except (OSError, pa.ArrowException) as exc:
            logger.warning(
                "census: %s cannot be read (its chunks are counted again): %s", name, exc
            )
            continue
        for key, rows, tokens, documents, lengths in zip(
            columns["key"],
            columns["rows"],
            columns["tokens"],
            columns["documents"],
            columns["lengths"],
            strict=True,
        ):
            each = None if lengths is None else np.asarray(lengths, np.int32)
            found[key] = ChunkCensus(rows, tokens, documents, each)
    return found


def _write(fs: FileSystemSpec, folder: str, name: str, data: bytes) -> None:
    """``data`` as ``folder/name``, whole or not at all."""
    store = fs.fsspec()
    path = f"{folder}/{name}"
    if fs.is_local:
        os.makedirs(folder, exist_ok=True)
        temporary = f"{path}.{os.getpid()}.tmp"
        with open(temporary, "wb") as out:
            out.write(data)
        os.replace(temporary, path)
        return
    with contextlib.suppress(OSError):
        store.makedirs(folder, exist_ok=True)
    store.pipe_file(path, data)  # (an object store's put is whole or nothing)
