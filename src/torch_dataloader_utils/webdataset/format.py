"""WebDataset tar shards: chunks are sample ranges read through each shard's index.

Each sample is one row: ``__key__``, ``__url__`` and one column per extension. Planning loads
every shard's index (the sibling ``.idx``, a local cache, or a header-only scan: see
`webdataset.loading.load_index`) in parallel threads, so row counts are exact; reading a range
of samples computes the byte spans of the selected components from the index, reads them in a
few range requests, checks the header before each component (`webdataset.headers`) and
slices the members out. What reading needs of the plan (the columns found, the components
that skip a sample) travels in its `WebDatasetReadOptions`.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import Literal

import numpy as np
import pyarrow as pa

from ..errors import (
    ColumnNotFoundError,
    CorruptFileError,
    DataError,
    InvalidArgumentError,
    MissingComponentError,
    StorageError,
)
from ..errors.keywords import check_flags
from ..formats.base import Format, FormatPlan, Listing, ReadOptions
from ..formats.handles import HandleCache
from ..formats.opening import each_file
from ..fs import FileSystemSpec, ListedFile
from ..fs.ranges import ReadsAhead
from ..fs.threads import AHEAD_THREADS
from ..planning import Chunk
from . import slicing
from .decoders import (
    Column,
    DecodeOptions,
    Decoder,
    arrow_type,
    column_of,
    decode_ints,
    decode_text,
    decoder_for,
)
from .headers import check_headers, check_span
from .loading import load_index
from .options import WebDatasetReadOptions
from .slicing import ShardTable

__all__ = ["MISSING_COMPONENT_POLICIES", "WebDatasetFormat", "WebDatasetReadOptions"]

MissingComponent = Literal["error", "empty", "skip"]
MISSING_COMPONENT_POLICIES: tuple[str, ...] = ("error", "empty", "skip")

KEY, URL = "__key__", "__url__"
# Shard indexes kept per worker (a 10k-sample index takes ~1 MB as arrays).
_SHARDS = 16


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

    On object storage, the first range request of the rows to be read next starts in a
    background thread (`prefetch`, and the next request of a read while one is sliced): at
    most two requests ahead (`fs.threads.AHEAD_THREADS`), in threads of the format's own.

    Raises:
        InvalidArgumentError: an unknown ``missing_component``, or a flag that is not a bool.
    """

    name = "webdataset"
    sample_columns = (URL, KEY)

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
        check_flags(
            case_sensitive_extensions=case_sensitive_extensions,
            decode=decode,
            decode_images=decode_images,
            allow_pickle=allow_pickle,
        )
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
        # Per process (a forked child or an unpickled copy starts its own: `fs.forks`): the
        # shard indexes loaded, and the remote reads started ahead.
        self._shards: HandleCache[str, ShardTable] = HandleCache(_SHARDS)
        self._ahead: ReadsAhead[tuple[str, int, int], bytes] = ReadsAhead(
            AHEAD_THREADS, name="tdu-wds-fetch"
        )

    # --- indexes -----------------------------------------------------------------------------

    def _load(self, path: str, size: int, fs: FileSystemSpec) -> ShardTable:
        index = load_index(
            path,
            fs,
            size=size,
            lowercase=not self.case_sensitive_extensions,
            cache_dir=fs.metadata_dir("wds-index", self.index_cache_dir),
            version=fs.pinned_version(path),
        )
        return ShardTable(path, fs.url(path), size, index.arrays())

    def _shard(self, path: str, fs: FileSystemSpec) -> ShardTable:
        def load() -> ShardTable:
            return self._load(path, fs.file_size(path), fs)

        return self._shards.get(path, load)

    # --- columns -----------------------------------------------------------------------------

    def _column(self, name: str) -> Column:
        return column_of(name, self.decoding, case_sensitive=self.case_sensitive_extensions)

    def _columns(self, options: ReadOptions, shards: Sequence[ShardTable]) -> tuple[Column, ...]:
        """The columns read: those asked for, else the plan's (`WebDatasetReadOptions`), else
        every extension of ``shards``."""
        names = options.columns
        if names is None and isinstance(options, WebDatasetReadOptions):
            names = options.all_columns
        if names is None:
            names = (KEY, URL, *dict.fromkeys(e for s in shards for e in s.extensions))
        return tuple(self._column(c) for c in names)

    @staticmethod
    def _schema(columns: Sequence[Column]) -> pa.Schema:
        return pa.schema([pa.field(c.name, arrow_type(c.storage)) for c in columns])

    def schema(self, file: ListedFile, fs: FileSystemSpec) -> pa.Schema:
        shard = self._load(file.path, file.size, fs)
        return self._schema(self._columns(ReadOptions(), [shard]))

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

    def _kept(
        self, shard: ShardTable, columns: Sequence[Column], options: ReadOptions
    ) -> np.ndarray:
        """Which samples are rows: all but those lacking a component that skips (the plan's
        `WebDatasetReadOptions.skipping`, else those of ``columns``)."""
        keep = np.ones(shard.num_samples, bool)
        for column in columns:
            if column.alternatives and self.missing_component == "error":
                present = shard.pick(column.alternatives)[0] >= 0
                if not present.all():
                    i = int(np.flatnonzero(~present)[0])
                    raise MissingComponentError(slicing.missing(shard, i, column.name))
        if self.missing_component == "skip":
            skipping = options.skipping if isinstance(options, WebDatasetReadOptions) else None
            if skipping is None:
                skipping = tuple(c.alternatives for c in columns if c.alternatives)
            for alternatives in skipping:
                keep &= shard.pick(alternatives)[0] >= 0
        return keep

    def plan(self, listing: Listing, fs: FileSystemSpec, options: ReadOptions) -> FormatPlan:
        shards = each_file(lambda f: self._load(f.path, f.size, fs), listing.files)
        columns = self._columns(options, shards)
        found = {e for s in shards for e in s.extensions}
        for column in columns:
            if column.alternatives and not found.intersection(column.alternatives):
                raise ColumnNotFoundError(
                    f"column {column.name!r}: no sample of the {len(listing)} shard(s) has a "
                    f"component {' or '.join(map(repr, column.alternatives))}; extensions "
                    f"found: {sorted(found)}"
                )
        planned = WebDatasetReadOptions.of(
            options,
            all_columns=tuple(c.name for c in columns) if options.columns is None else None,
            skipping=tuple(c.alternatives for c in columns if c.alternatives),
        )
        chunks: list[Chunk] = []
        rows = total = 0
        for shard, partition in zip(shards, listing.partitions, strict=True):
            kept = np.flatnonzero(self._kept(shard, columns, planned))
            sizes = sum(
                (shard.pick(c.alternatives)[1][kept] for c in columns if c.alternatives),
                np.zeros(len(kept), np.int64),
            )
            chunks.extend(slicing.chunks_of(shard.path, kept, sizes, partition, options))
            rows += len(kept)
            total += int(sizes.sum())
        row_bytes = max(total / rows if rows else 1.0, 1)
        return FormatPlan(chunks, self._schema(columns), row_bytes, read_options=planned)

    # --- reading -----------------------------------------------------------------------------

    def _rows(
        self, shard: ShardTable, chunk: Chunk, columns: Sequence[Column], options: ReadOptions
    ) -> np.ndarray:
        """The samples that are the chunk's rows, checked against the plan."""
        kept = self._kept(shard, columns, options)[chunk.start : chunk.stop]
        kept = np.flatnonzero(kept) + chunk.start
        if chunk.stop > shard.num_samples or len(kept) != chunk.num_rows:
            raise CorruptFileError(
                f"{shard.url}: samples {chunk.start}:{chunk.stop} no longer hold the "
                f"{chunk.num_rows} rows planned (the shard has {shard.num_samples} samples "
                "now): it changed since planning"
            )
        return kept

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
        rows = self._rows(shard, chunk, columns, options)[row_start:row_stop]
        requests = slicing.requests(
            [shard.pick(c.alternatives) for c in columns if c.alternatives],
            rows,
            local=fs.is_local,
        )
        following, started = next(requests, None), None
        try:
            while following is not None:
                (some, spans, span), following = following, next(requests, None)
                if following is not None and following[2] is not None and not fs.is_local:
                    # The next request downloads while this one is sliced.
                    started = self._start(shard, following[2], fs)
                yield self._batch(
                    shard, columns=columns, schema=schema, rows=some, spans=spans, span=span, fs=fs
                )
        finally:
            if started is not None:  # (taken, unless the reader stopped early)
                self._ahead.drop(started)

    def prefetch(
        self,
        chunk: Chunk,
        row_start: int,
        row_stop: int,
        fs: FileSystemSpec,
        options: ReadOptions,
    ) -> None:
        """Start the first range request of rows ``[row_start, row_stop)`` (remote shards)."""
        if fs.is_local:
            return
        shard = self._shard(chunk.path, fs)
        columns = self._columns(options, [shard])
        try:
            rows = self._rows(shard, chunk, columns, options)[row_start:row_stop]
        except CorruptFileError:
            return  # read says what changed
        picked = [shard.pick(c.alternatives) for c in columns if c.alternatives]
        first = next(slicing.requests(picked, rows, local=False), None)
        if first is not None and first[2] is not None:
            self._start(shard, first[2], fs)

    def _start(
        self, shard: ShardTable, span: tuple[int, int], fs: FileSystemSpec
    ) -> tuple[str, int, int] | None:
        """Start reading ``span`` of ``shard`` (a few at most pending); its key if so."""
        first, end = span
        if first < 0 or end > shard.size:
            return None  # _batch says what is wrong
        key = (shard.path, first, end)
        started = self._ahead.submit(key, fs.read_range, shard.path, first, end - first)
        return key if started else None

    def _batch(
        self,
        shard: ShardTable,
        *,
        columns: Sequence[Column],
        schema: pa.Schema,
        rows: np.ndarray,
        spans: Sequence[tuple[np.ndarray, np.ndarray]],
        span: tuple[int, int] | None,
        fs: FileSystemSpec,
    ) -> pa.RecordBatch:
        buffer, base = b"", 0
        if span is not None:
            base, end = span
            check_span(shard, base, end)
            buffer = self._read(shard, base, end, fs)
            alternatives = [c.alternatives for c in columns if c.alternatives]
            check_headers(shard, buffer, base, rows=rows, spans=spans, alternatives=alternatives)
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
        if not arrays:
            # No column (a hive-partition-only projection, a count): the rows still count.
            return pa.RecordBatch.from_arrays([pa.nulls(len(rows))], names=["_"]).select([])
        return pa.RecordBatch.from_arrays(arrays, schema=schema)

    def _values(
        self,
        shard: ShardTable,
        column: Column,
        *,
        rows: np.ndarray,
        view: pa.Buffer,
        base: int,
        off: np.ndarray,
        size: np.ndarray,
    ) -> pa.Array:
        """The column's values (`slicing.slice_values`), decoded to its storage."""
        missing = off < 0
        if self.missing_component == "error" and missing.any():
            i = int(rows[np.flatnonzero(missing)[0]])
            raise MissingComponentError(slicing.missing(shard, i, column.name))
        try:
            values = slicing.slice_values(view, base, off, size, nulls=column.storage == "int")
        except ValueError as exc:
            raise DataError(slicing.bad_value(shard, column.name, rows, off, exc)) from exc
        if column.storage == "binary":
            return values
        try:
            return decode_ints(values) if column.storage == "int" else decode_text(values)
        except ValueError as exc:
            raise CorruptFileError(slicing.bad_value(shard, column.name, rows, off, exc)) from exc

    def _read(self, shard: ShardTable, base: int, end: int, fs: FileSystemSpec) -> bytes:
        """Bytes ``[base, end)`` of the shard: a read started ahead, or a new one."""
        started = self._ahead.take((shard.path, base, end))
        try:
            if started is not None:
                return started.result()
            return fs.read_range(shard.path, base, end - base)
        except StorageError:
            raise
        except OSError as exc:
            # A short read: the shard may have shrunk since its index was loaded (kept
            # across epochs). Ask its size now rather than guess from the message.
            size = FileSystemSpec.file_size(fs, shard.path)  # (from the store, not a plan)
            if size < end:
                self._shards.forget(shard.path)
                raise CorruptFileError(
                    f"{shard.url}: bytes {base}-{end} are past its end ({size} bytes "
                    "now): the shard changed since planning"
                ) from exc
            raise

    def close(self) -> None:
        """Drop the reads started ahead and their threads. The indexes stay cached (at most
        `_SHARDS`): streams of the next epoch read the same shards."""
        self._ahead.close()
