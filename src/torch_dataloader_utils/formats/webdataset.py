"""WebDataset tar shards: chunks are sample ranges read through each shard's index.

Each sample is one row: ``__key__``, ``__url__`` and one column per extension. Planning loads
every shard's index (the sibling ``.idx``, a local cache, or a header-only scan: see
`webdataset.index.load_index`) in parallel threads, so row counts are exact; reading a range
of samples computes the byte spans of the selected components from the index, reads them in a
few large range requests and slices the members out without parsing tar headers again.
"""

from __future__ import annotations

import os
from collections import OrderedDict
from collections.abc import Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import pyarrow as pa

from ..errors import (
    ColumnNotFoundError,
    CorruptFileError,
    InvalidArgumentError,
    MissingComponentError,
    StorageError,
)
from ..fs import FileSystemSpec, SourceFile
from ..fs.ranges import HOLE_BYTES
from ..planning import Chunk
from ..webdataset.decoders import (
    DecodeOptions,
    Decoder,
    Storage,
    arrow_type,
    decode_ints,
    decode_text,
    decoder_for,
    storage_of,
)
from ..webdataset.index import load_index
from .base import Format, FormatPlan, ReadOptions

__all__ = ["MISSING_COMPONENT_POLICIES", "WebDatasetFormat"]

MissingComponent = Literal["error", "empty", "skip"]
MISSING_COMPONENT_POLICIES: tuple[str, ...] = ("error", "empty", "skip")

KEY, URL = "__key__", "__url__"
# Index loads are I/O (one small request per shard remotely), hence threads.
_PLAN_THREADS = 32
# Default chunk size (bytes of the selected components) without split_bytes/split_rows: about a
# Parquet row group, so a shard of gigabytes still shuffles and balances in many pieces, while
# a chunk stays far larger than one range request.
CHUNK_BYTES = 32 << 20
# One range request reads at most about this many bytes of consecutive samples (one
# RecordBatch each): large enough to amortise a request, small enough to bound memory.
READ_BYTES = 8 << 20
# Rows per batch when no component bytes are read (only __key__/__url__).
_INDEX_ROWS = 65_536
# Shard indexes kept per worker (a 10k-sample index takes ~1 MB as arrays).
_SHARDS = 16
_HEADER = 512
_MAGIC = np.frombuffer(b"ustar", np.uint8)  # at offset 257 of every (ustar/GNU/PAX) header


@dataclass(frozen=True)
class _Column:
    name: str  # as requested: "jpg;png"
    alternatives: tuple[str, ...]  # extensions, first present wins ((): __key__ or __url__)
    storage: Storage


class _Shard:
    """One shard's index as arrays: component offsets and sizes per extension (-1: absent)."""

    def __init__(self, path: str, url: str, size: int, index: Any) -> None:
        self.path, self.url, self.size = path, url, size
        samples = index.samples
        self.num_samples = len(samples)
        self.keys = pa.array([s.key for s in samples], pa.string())
        self.extensions: dict[str, tuple[np.ndarray, np.ndarray]] = {}
        self._picked: dict[_Column, tuple[np.ndarray, np.ndarray]] = {}
        for i, sample in enumerate(samples):
            for c in sample.components:
                found = self.extensions.get(c.ext)
                if found is None:
                    found = self.extensions[c.ext] = (
                        np.full(self.num_samples, -1, np.int64),
                        np.zeros(self.num_samples, np.int64),
                    )
                found[0][i], found[1][i] = c.offset, c.size

    def pick(self, column: _Column) -> tuple[np.ndarray, np.ndarray]:
        """Offsets (-1: absent) and sizes of ``column``: the first alternative present."""
        found = self._picked.get(column)
        if found is None:
            found = self._picked[column] = self._pick(column)
        return found

    def _pick(self, column: _Column) -> tuple[np.ndarray, np.ndarray]:
        offsets = np.full(self.num_samples, -1, np.int64)
        sizes = np.zeros(self.num_samples, np.int64)
        for ext in column.alternatives:
            found = self.extensions.get(ext)
            if found is not None:
                take = (offsets < 0) & (found[0] >= 0)
                offsets[take], sizes[take] = found[0][take], found[1][take]
        return offsets, sizes


class WebDatasetFormat(Format):
    """WebDataset tar shards (also ``format="tar"`` or ``"wds"``).

    Columns: ``__key__`` (the sample key), ``__url__`` (the shard's URL) and one per extension;
    by default every extension found in the shards, in order of first appearance. A requested
    column may list alternatives, DALI-style: ``"jpg;png"`` holds the first of them present.

    Args:
        missing_component: a sample lacks a requested component: ``"error"`` (default; raised
            at planning, from the indexes, as `MissingComponentError` naming shard, key and
            column, so nothing fails mid-epoch), ``"empty"`` (a zero-byte value: ``b""``,
            ``""`` for text, null for integers, ``None`` once decoded) or ``"skip"`` (the
            sample is left out; counted at planning, so row counts stay exact).
        case_sensitive_extensions: keep extensions' case (``JPG`` and ``jpg`` differ); by
            default they are lower-cased as webdataset does.
        decode: ``False`` keeps every component as bytes.
        decode_images: decode images to ``uint8`` HWC RGB arrays (needs Pillow).
        allow_pickle: decode ``pyd``/``pickle``/``pth`` components (runs code from the data).
        decoders: ``{extension: function(bytes)}``, before the built-in ones (must pickle).
        index_cache_dir: where indexes built by scanning are cached (``""``: no cache).
    """

    name = "webdataset"

    def __init__(
        self,
        *,
        missing_component: MissingComponent = "error",
        case_sensitive_extensions: bool = False,
        decode: bool = True,
        decode_images: bool = False,
        allow_pickle: bool = False,
        decoders: Mapping[str, Decoder] | None = None,
        index_cache_dir: str | None = None,
    ) -> None:
        if missing_component not in MISSING_COMPONENT_POLICIES:
            raise InvalidArgumentError(
                f"missing_component must be one of {MISSING_COMPONENT_POLICIES}, "
                f"got {missing_component!r}"
            )
        self.missing_component = missing_component
        self.case_sensitive_extensions = case_sensitive_extensions
        self.decoding = DecodeOptions(
            decode=decode,
            decode_images=decode_images,
            allow_pickle=allow_pickle,
            custom=dict(decoders or {}),
        )
        self.index_cache_dir = index_cache_dir
        # The default columns (all extensions of all shards), set by `plan` for `read`:
        # a worker sees one shard, not the union.
        self._default: tuple[_Column, ...] | None = None
        self._shards: OrderedDict[str, _Shard] = OrderedDict()
        self._pid = os.getpid()

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_shards": OrderedDict()}  # each process loads its own

    # --- indexes -----------------------------------------------------------------------------

    def _load(self, path: str, size: int, fs: FileSystemSpec) -> _Shard:
        index = load_index(
            path,
            fs,
            size=size,
            lowercase=not self.case_sensitive_extensions,
            cache_dir=self.index_cache_dir,
        )
        return _Shard(path, fs.url(path), size, index)

    def _shard(self, path: str, fs: FileSystemSpec) -> _Shard:
        if self._pid != os.getpid():
            self._shards, self._pid = OrderedDict(), os.getpid()
        found = self._shards.get(path)
        if found is not None:
            self._shards.move_to_end(path)
            return found
        info = fs.request(lambda: fs.arrow().get_file_info(path), what=fs.url(path))
        found = self._shards[path] = self._load(path, int(info.size or 0), fs)
        while len(self._shards) > _SHARDS:
            self._shards.popitem(last=False)
        return found

    # --- columns -----------------------------------------------------------------------------

    def _ext(self, ext: str) -> str:
        return ext if self.case_sensitive_extensions else ext.lower()

    def _column(self, name: str) -> _Column:
        if name in (KEY, URL):
            return _Column(name, (), "text")
        alternatives = tuple(dict.fromkeys(self._ext(e.strip()) for e in name.split(";")))
        if not all(alternatives):
            raise InvalidArgumentError(f"column {name!r}: an empty extension between ';'")
        kinds = {storage_of(e, self.decoding) for e in alternatives}
        decoders = {_identity(decoder_for(e, self.decoding)) for e in alternatives}
        if len(kinds) > 1 or len(decoders) > 1:
            raise InvalidArgumentError(
                f"column {name!r}: its alternatives decode differently; list alternatives of "
                "one kind (e.g. 'jpg;png'), or pass decode=False"
            )
        return _Column(name, alternatives, kinds.pop())

    def _columns(self, options: ReadOptions, shards: Sequence[_Shard]) -> tuple[_Column, ...]:
        if options.columns is not None:
            return tuple(self._column(c) for c in options.columns)
        if self._default is not None:
            return self._default
        exts = dict.fromkeys(e for s in shards for e in s.extensions)
        return tuple(self._column(c) for c in (KEY, URL, *exts))

    @staticmethod
    def _schema(columns: Sequence[_Column]) -> pa.Schema:
        return pa.schema([pa.field(c.name, arrow_type(c.storage)) for c in columns])

    def schema(self, file: SourceFile, fs: FileSystemSpec) -> pa.Schema:
        shard = self._load(file.path, file.size, fs)
        exts = list(shard.extensions)
        return self._schema([self._column(c) for c in (KEY, URL, *exts)])

    def companion(self, path: str) -> bool:
        return path.endswith(".idx")  # a shard's index, beside it

    def decoders(self, schema: pa.Schema) -> dict[str, Decoder]:
        found = {}
        for name in schema.names:
            if name not in (KEY, URL):
                decoder = decoder_for(self._column(name).alternatives[0], self.decoding)
                if decoder is not None:
                    found[name] = decoder
        return found

    # --- planning ----------------------------------------------------------------------------

    def _kept(self, shard: _Shard, columns: Sequence[_Column]) -> np.ndarray:
        """Which samples are rows (all, unless skipped for a missing component)."""
        keep = np.ones(shard.num_samples, bool)
        for column in columns:
            if not column.alternatives:
                continue
            present = shard.pick(column)[0] >= 0
            if self.missing_component == "skip":
                keep &= present
            elif self.missing_component == "error" and not present.all():
                i = int(np.flatnonzero(~present)[0])
                self._missing(shard, i, column)
        return keep

    @staticmethod
    def _missing(shard: _Shard, i: int, column: _Column) -> None:
        have = sorted(e for e, (off, _) in shard.extensions.items() if off[i] >= 0)
        raise MissingComponentError(
            f"{shard.url}: sample {i} (key {shard.keys[i].as_py()!r}) has no {column.name!r} "
            f"component (it has {have}); pass missing_component='empty' or 'skip' to the "
            "webdataset format, or select other columns"
        )

    def plan(
        self,
        files: Sequence[SourceFile],
        partitions: Sequence[tuple[tuple[str, object], ...]],
        fs: FileSystemSpec,
        options: ReadOptions,
    ) -> FormatPlan:
        threads = max(1, min(_PLAN_THREADS, len(files)))
        with ThreadPoolExecutor(threads, thread_name_prefix="tdu-plan") as pool:
            shards = list(pool.map(lambda f: self._load(f.path, f.size, fs), files))
        self._default = None
        columns = self._columns(options, shards)
        found = {e for s in shards for e in s.extensions}
        for column in columns:
            if column.alternatives and not found.intersection(column.alternatives):
                raise ColumnNotFoundError(
                    f"column {column.name!r}: no sample of the {len(files)} shard(s) has a "
                    f"component {' or '.join(map(repr, column.alternatives))}; extensions "
                    f"found: {sorted(found)}"
                )
        chunks: list[Chunk] = []
        rows = total = 0
        for shard, partition in zip(shards, partitions, strict=True):
            kept = np.flatnonzero(self._kept(shard, columns))
            sizes = sum(
                (shard.pick(c)[1][kept] for c in columns if c.alternatives),
                np.zeros(len(kept), np.int64),
            )
            chunks.extend(_group(shard.path, kept, sizes, partition, options))
            rows += len(kept)
            total += int(sizes.sum())
        if options.columns is None:
            self._default = columns
        row_bytes = total / rows if rows else 1.0
        return FormatPlan(chunks=chunks, schema=self._schema(columns), row_bytes=max(row_bytes, 1))

    # --- reading -----------------------------------------------------------------------------

    def read(
        self,
        chunk: Chunk,
        row_start: int,
        row_stop: int,
        fs: FileSystemSpec,
        options: ReadOptions,
    ) -> Iterator[pa.RecordBatch]:
        shard = self._shard(chunk.path, fs)
        columns = self._columns(options, [shard])
        schema = self._schema(columns)
        kept = np.flatnonzero(self._kept(shard, columns)[chunk.start : chunk.stop]) + chunk.start
        if chunk.stop > shard.num_samples or len(kept) != chunk.num_rows:
            raise CorruptFileError(
                f"{shard.url}: samples {chunk.start}:{chunk.stop} no longer hold the "
                f"{chunk.num_rows} rows planned (the shard has {shard.num_samples} samples "
                "now): it changed since planning"
            )
        rows = kept[row_start:row_stop]
        picked = [shard.pick(c) if c.alternatives else None for c in columns]
        data = [(off[rows], size[rows]) for off, size in (p for p in picked if p is not None)]
        for lo, hi in _groups(data, len(rows)):
            yield self._batch(
                shard, columns=columns, schema=schema, rows=rows[lo:hi], picked=picked, fs=fs
            )

    def _batch(
        self,
        shard: _Shard,
        *,
        columns: Sequence[_Column],
        schema: pa.Schema,
        rows: np.ndarray,
        picked: Sequence[tuple[np.ndarray, np.ndarray] | None],
        fs: FileSystemSpec,
    ) -> pa.RecordBatch:
        spans = [(p[0][rows], p[1][rows]) for p in picked if p is not None]
        present = [off[off >= 0] for off, _ in spans]
        starts = [off.min() for off in present if len(off)]
        buffer, base = b"", 0
        if starts:
            base = int(min(starts)) - _HEADER
            if base < 0:
                raise CorruptFileError(
                    f"{shard.url}: its index puts data at offset {base + _HEADER}, before any "
                    "tar header could fit: the index is not this shard's"
                )
            end = max(int((off + size)[off >= 0].max()) for off, size in spans if (off >= 0).any())
            if end > shard.size:
                raise CorruptFileError(
                    f"{shard.url}: bytes {base}-{end} are past the end of the shard "
                    f"({shard.size} bytes): it is shorter than its index says"
                )
            buffer = self._read(shard, base, end, fs)
            self._check_headers(shard, buffer, base, rows, spans)
        view = pa.py_buffer(buffer)
        arrays: list[pa.Array] = []
        spans_iter = iter(spans)
        for column in columns:
            if column.name == KEY:
                arrays.append(shard.keys.take(pa.array(rows)))
            elif column.name == URL:
                arrays.append(pa.repeat(pa.scalar(shard.url, pa.string()), len(rows)))
            else:
                off, size = next(spans_iter)
                arrays.append(
                    self._values(shard, column, rows=rows, view=view, base=base, off=off, size=size)
                )
        return pa.RecordBatch.from_arrays(arrays, schema=schema)

    def _values(
        self,
        shard: _Shard,
        column: _Column,
        *,
        rows: np.ndarray,
        view: pa.Buffer,
        base: int,
        off: np.ndarray,
        size: np.ndarray,
    ) -> pa.Array:
        """The column's values, sliced out of ``view`` (file bytes from ``base``) in bulk:
        a binary array of 2n values alternating component and gap, then every other one."""
        missing = off < 0
        if missing.any():
            if self.missing_component == "error":
                self._missing(shard, int(rows[np.flatnonzero(missing)[0]]), column)
            # An empty value where the previous one ends keeps the offsets ascending.
            ends = np.maximum.accumulate(np.where(missing, 0, off + size - base))
            starts = np.where(missing, np.concatenate([[0], ends[:-1]]), off - base)
            size = np.where(missing, 0, size)
        else:
            starts = off - base
        bounds = np.empty(2 * len(rows) + 1, np.int32)
        bounds[0:-1:2], bounds[1::2] = starts, starts + size
        bounds[-1] = bounds[-2]
        validity = None
        if column.storage == "int" and missing.any():
            bits = np.repeat(~missing, 2).astype(np.uint8)
            validity = pa.py_buffer(np.packbits(bits, bitorder="little").tobytes())
        both = pa.BinaryArray.from_buffers(
            pa.binary(), 2 * len(rows), [validity, pa.py_buffer(bounds.tobytes()), view]
        )
        values = both.take(pa.array(np.arange(0, 2 * len(rows), 2)))
        if column.storage == "binary":
            return values
        try:
            return decode_ints(values) if column.storage == "int" else decode_text(values)
        except ValueError as exc:
            i = int(rows[exc.args[1]])
            raise CorruptFileError(
                f"{shard.url}: sample {i} (key {shard.keys[i].as_py()!r}), component "
                f"{column.name!r} at offset {int(off[exc.args[1]])}: {exc.args[0]}"
            ) from exc

    def _read(self, shard: _Shard, base: int, end: int, fs: FileSystemSpec) -> bytes:
        try:
            return fs.read_range(shard.path, base, end - base)
        except StorageError:
            raise
        except OSError as exc:
            # A short read: the shard may have shrunk since its index was loaded (kept
            # across epochs). Ask its size now rather than guess from the message.
            info = fs.request(lambda: fs.arrow().get_file_info(shard.path), what=shard.url)
            if info.size is not None and info.size < end:
                self._shards.pop(shard.path, None)
                raise CorruptFileError(
                    f"{shard.url}: bytes {base}-{end} are past its end ({info.size} bytes "
                    "now): the shard changed since planning"
                ) from exc
            raise

    @staticmethod
    def _check_headers(
        shard: _Shard,
        buffer: bytes,
        base: int,
        rows: np.ndarray,
        spans: Sequence[tuple[np.ndarray, np.ndarray]],
    ) -> None:
        """Each component's data follows its tar header (whose magic is at +257): the cheap
        check that the shard still has the layout its index describes."""
        data = np.frombuffer(buffer, np.uint8)
        for off, _ in spans:
            at = off[off >= 0] - base - _HEADER + 257
            bad = ~(data[at[:, None] + np.arange(5)] == _MAGIC).all(axis=1)
            if bad.any():
                k = int(np.flatnonzero(off >= 0)[np.flatnonzero(bad)[0]])
                i = int(rows[k])
                raise CorruptFileError(
                    f"{shard.url}: sample {i} (key {shard.keys[i].as_py()!r}): no tar header "
                    f"before offset {int(off[k])}; the shard changed since its index was "
                    "made (delete the stale .idx, or rebuild it with `tdu index`)"
                )

    def close(self) -> None:
        """Nothing to release: no file stays open. The indexes stay cached (at most
        ``_SHARDS``): streams of the next epoch read the same shards."""


def _identity(decoder: Decoder | None) -> object:
    """What makes two decoders the same (built-in ones differ only in the name in errors)."""
    return getattr(decoder, "decode", decoder)


def _group(
    path: str,
    kept: np.ndarray,
    sizes: np.ndarray,
    partition: tuple[tuple[str, object], ...],
    options: ReadOptions,
) -> list[Chunk]:
    """Chunks of consecutive kept samples: about ``split_bytes``/``split_rows`` each
    (whichever is reached first), ``CHUNK_BYTES`` with neither."""
    split_rows, split_bytes = options.split_rows, options.split_bytes
    if split_rows is None and split_bytes is None:
        split_bytes = CHUNK_BYTES
    cum = np.concatenate([[0], np.cumsum(sizes)])
    chunks, first = [], 0
    while first < len(kept):
        stop = len(kept)
        if split_rows is not None:
            stop = min(stop, first + split_rows)
        if split_bytes is not None:  # the first sample at which the target is reached
            stop = min(stop, int(np.searchsorted(cum, cum[first] + split_bytes)))
        stop = max(stop, first + 1)
        chunks.append(
            Chunk(
                path=path,
                start=int(kept[first]),
                stop=int(kept[stop - 1]) + 1,
                num_rows=stop - first,
                num_bytes=int(cum[stop] - cum[first]),
                partition=partition,
            )
        )
        first = stop
    return chunks


def _groups(data: Sequence[tuple[np.ndarray, np.ndarray]], n: int) -> Iterator[tuple[int, int]]:
    """Row ranges read with one request each: consecutive samples whose components span at
    most about ``READ_BYTES``, split where a gap of more than ``HOLE_BYTES`` would be read."""
    if not data:
        for lo in range(0, n, _INDEX_ROWS):
            yield lo, min(n, lo + _INDEX_ROWS)
        return
    offsets = np.stack([off for off, _ in data])
    ends = np.stack([np.where(off >= 0, off + size, -1) for off, size in data])
    big = 1 << 62  # absent everywhere (room left to add READ_BYTES)
    lo_b = np.where(offsets >= 0, offsets, big).min(axis=0)
    hi_b = np.maximum.accumulate(ends.max(axis=0))  # ascending; absent rows take the last end
    lo_b = np.minimum.accumulate(lo_b[::-1])[::-1]  # absent rows take the next start
    breaks = np.flatnonzero(lo_b[1:] - hi_b[:-1] > HOLE_BYTES) + 1
    first = 0
    for cut in [*breaks.tolist(), n]:
        while first < cut:
            stop = int(np.searchsorted(hi_b, lo_b[first] + READ_BYTES, side="right"))
            stop = min(max(stop, first + 1), cut)
            yield first, stop
            first = stop
