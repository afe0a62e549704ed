"""The WebDataset format's numpy side: chunks of samples, range requests, and component
values sliced out of the bytes read, all from an index held as arrays.

Pure functions of offsets and sizes (no I/O): the format (`format.py`) reads the
bytes and words most errors.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import numpy as np
import pyarrow as pa

from ..errors import CorruptFileError
from ..formats.base import Partition, ReadOptions
from ..fs.ranges import HOLE_BYTES
from ..planning import Chunk
from .arrays import IndexArrays
from .tar import BLOCK as HEADER  # the header block before each member's data

__all__ = [
    "CHUNK_BYTES",
    "HEADER",
    "INDEX_ROWS",
    "LOCAL_HOLE_BYTES",
    "MAX_VALUE_BYTES",
    "READ_BYTES",
    "ShardTable",
    "bad_value",
    "chunks_of",
    "read_groups",
    "requests",
    "slice_values",
    "span_of",
]

# Default chunk size (bytes of the selected components) without split_bytes/split_rows: about a
# Parquet row group, so a shard of gigabytes still shuffles and balances in many chunks, while
# a chunk stays far larger than one range request.
CHUNK_BYTES = 32 << 20
# One range request reads at most about this many bytes of consecutive samples (one
# RecordBatch each): large enough to amortise a request, small enough to bound memory.
READ_BYTES = 8 << 20
# Rows per batch when no component bytes are read (only __key__/__url__).
INDEX_ROWS = 65_536
# Local shards: a gap between selected components is read through (one request) only up to
# this size; a read costs little locally, reading bytes not wanted does not.
LOCAL_HOLE_BYTES = 64 << 10
# The most bytes one value of a `pa.binary()` array holds (int32 offsets).
MAX_VALUE_BYTES = (1 << 31) - 1

Spans = Sequence[tuple[np.ndarray, np.ndarray]]


class ShardTable:
    """One shard's index as the format reads it: per extension, each sample's component
    offset (-1: absent) and size.

    Args:
        path: the shard's path.
        url: its URL (for errors).
        size: its size in bytes.
        arrays: its index (`ShardIndex.arrays`).
    """

    def __init__(self, path: str, url: str, size: int, arrays: IndexArrays) -> None:
        self.path, self.url, self.size = path, url, size
        self.num_samples = len(arrays.keys)
        try:
            # (the names hold the keys and extensions: all of them are UTF-8 when these are)
            self.names = pa.array(arrays.names, pa.string())
            self.keys = pa.array(arrays.keys, pa.string())
        except UnicodeEncodeError:
            self._not_utf8(arrays)
        sample = arrays.sample_of()
        self.extensions: dict[str, tuple[np.ndarray, np.ndarray]] = {}
        self._component: dict[str, np.ndarray] = {}  # per sample, its position in names
        for j, ext in enumerate(arrays.extensions):
            mine = np.flatnonzero(arrays.ext == j)
            offsets = np.full(self.num_samples, -1, np.int64)
            sizes = np.zeros(self.num_samples, np.int64)
            component = np.full(self.num_samples, -1, np.int64)
            offsets[sample[mine]], sizes[sample[mine]] = arrays.offsets[mine], arrays.sizes[mine]
            component[sample[mine]] = mine
            self.extensions[ext], self._component[ext] = (offsets, sizes), component
        self._picked: dict[tuple[str, ...], tuple[np.ndarray, np.ndarray, np.ndarray]] = {}

    def _not_utf8(self, arrays: IndexArrays) -> None:
        for name, offset in zip(arrays.names, arrays.offsets.tolist(), strict=True):
            try:
                name.encode("utf-8")
            except UnicodeEncodeError:
                raise CorruptFileError(
                    f"{self.url}: member {name.encode('utf-8', 'surrogateescape')!r} (data at "
                    f"offset {offset}): its name is not "
                    "UTF-8; WebDataset keys and extensions are text: rename the members"
                ) from None
        raise CorruptFileError(f"{self.url}: a sample key is not UTF-8")  # (keys are in names)

    def pick(self, alternatives: tuple[str, ...]) -> tuple[np.ndarray, np.ndarray]:
        """Offsets (-1: absent) and sizes of a column: per sample, the first of the
        ``alternatives`` extensions present."""
        offsets, sizes, _ = self._pick(alternatives)
        return offsets, sizes

    def member_names(self, alternatives: tuple[str, ...], rows: np.ndarray) -> pa.StringArray:
        """The member names of a column's components in ``rows`` (null: absent)."""
        component = self._pick(alternatives)[2][rows]
        return self.names.take(pa.array(component, mask=component < 0))

    def _pick(self, alternatives: tuple[str, ...]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        found = self._picked.get(alternatives)
        if found is None:
            offsets = np.full(self.num_samples, -1, np.int64)
            sizes = np.zeros(self.num_samples, np.int64)
            component = np.full(self.num_samples, -1, np.int64)
            for ext in alternatives:
                have = self.extensions.get(ext)
                if have is not None:
                    take = (offsets < 0) & (have[0] >= 0)
                    offsets[take], sizes[take] = have[0][take], have[1][take]
                    component[take] = self._component[ext][take]
            found = self._picked[alternatives] = (offsets, sizes, component)
        return found


def bad_value(
    shard: ShardTable, column: str, rows: np.ndarray, off: np.ndarray, exc: ValueError
) -> str:
    """The message of a bad value: ``exc.args`` are ``(what, its position in rows)``."""
    i = int(rows[exc.args[1]])
    return (
        f"{shard.url}: sample {i} (key {shard.keys[i].as_py()!r}), component {column!r} at "
        f"offset {int(off[exc.args[1]])}: {exc.args[0]}"
    )


def missing(shard: ShardTable, i: int, column: str) -> str:
    """The message of sample ``i`` lacking a component of ``column``."""
    have = sorted(e for e, (off, _) in shard.extensions.items() if off[i] >= 0)
    return (
        f"{shard.url}: sample {i} (key {shard.keys[i].as_py()!r}) has no {column!r} "
        f"component (it has {have}); pass missing_component='empty' or 'skip' to the "
        "webdataset format, or select other columns"
    )


def chunks_of(
    path: str,
    kept: np.ndarray,
    sizes: np.ndarray,
    partition: Partition,
    options: ReadOptions,
) -> list[Chunk]:
    """Chunks of consecutive kept samples: about ``split_bytes``/``split_rows`` each
    (whichever is reached first), `CHUNK_BYTES` with neither.

    Args:
        path: the shard.
        kept: the positions of the samples that are rows, ascending.
        sizes: bytes of the selected components of each kept sample.
        partition: the shard's hive partition values.
        options: the split options.

    Returns:
        Chunks of sample ranges ``[start, stop)`` covering every kept sample once.
    """
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


def read_groups(data: Spans, n: int, *, local: bool) -> Iterator[tuple[int, int]]:
    """Row ranges read with one request each: consecutive samples whose components span at
    most about `READ_BYTES`, and whose gaps (the bytes between selected components: other
    components, other samples) are worth reading through.

    Locally a gap is read through up to `LOCAL_HOLE_BYTES`. Remotely (where a request costs
    far more) up to ``HOLE_BYTES``, and only while a request's gaps add up to no more than its
    selected bytes (headers and block padding included): at most half of what it reads is waste. So
    ``columns=["cls"]`` over shards of 100 KB images reads the class labels, not the images.

    Args:
        data: per selected column, the offsets (-1: absent) and sizes of the ``n`` rows.
        n: the rows.
        local: the shard is on a local filesystem.

    Yields:
        ``(lo, hi)`` row ranges, in order, covering all rows (`INDEX_ROWS` at a time when no
        component is selected).
    """
    if not data:
        for lo in range(0, n, INDEX_ROWS):
            yield lo, min(n, lo + INDEX_ROWS)
        return
    offsets = np.stack([off for off, _ in data])
    padded = [(size + HEADER - 1) // HEADER * HEADER for _, size in data]  # tar blocks
    ends = np.stack(
        [np.where(off >= 0, off + p, -1) for (off, _), p in zip(data, padded, strict=True)]
    )
    big = 1 << 62  # absent everywhere (room left to add READ_BYTES)
    lo_b = np.where(offsets >= 0, offsets, big).min(axis=0)
    hi_b = np.maximum.accumulate(ends.max(axis=0))  # ascending; absent rows take the last end
    lo_b = np.minimum.accumulate(lo_b[::-1])[::-1]  # absent rows take the next start
    gaps = np.concatenate([[0], np.maximum(lo_b[1:] - HEADER - hi_b[:-1], 0)])
    hole = LOCAL_HOLE_BYTES if local else HOLE_BYTES
    breaks = np.flatnonzero(gaps[1:] > hole) + 1
    wasted = selected = None
    if not local:  # gaps minus selected bytes, cumulated
        selected = np.sum(
            [np.where(off >= 0, p + HEADER, 0) for (off, _), p in zip(data, padded, strict=True)],
            axis=0,
        )
        wasted = np.cumsum(gaps - selected)
    first = 0
    for cut in [*breaks.tolist(), n]:
        while first < cut:
            stop = int(np.searchsorted(hi_b, lo_b[first] + READ_BYTES, side="right"))
            stop = min(max(stop, first + 1), cut)
            if wasted is not None and selected is not None and stop > first + 1:
                # Row i joins while gaps(first+1..i) <= selected(first..i), that is while
                # wasted[i] <= wasted[first] + selected[first].
                over = np.flatnonzero(wasted[first + 1 : stop] > wasted[first] + selected[first])
                if len(over):
                    stop = first + 1 + int(over[0])
            yield first, stop
            first = stop


def requests(
    picked: Spans, rows: np.ndarray, *, local: bool
) -> Iterator[tuple[np.ndarray, list[tuple[np.ndarray, np.ndarray]], tuple[int, int] | None]]:
    """The range requests that read ``rows`` (sample positions, ascending).

    Args:
        picked: per selected column, offsets and sizes of every sample (`ShardTable.pick`).
        rows: the samples to read.
        local: the shard is on a local filesystem (`read_groups`).

    Yields:
        Per request (`read_groups`): its rows, the spans (offsets, sizes) of their selected
        components, and its bytes ``(first, end)`` (`span_of`).
    """
    data = [(off[rows], size[rows]) for off, size in picked]
    for lo, hi in read_groups(data, len(rows), local=local):
        spans = [(off[lo:hi], size[lo:hi]) for off, size in data]
        yield rows[lo:hi], spans, span_of(spans)


def span_of(spans: Spans) -> tuple[int, int] | None:
    """The bytes one request reads for ``spans``: from the header before the first component
    to the end of the last; None when no component is present."""
    present = [(off >= 0) for off, _ in spans]
    starts = [int(off[p].min()) for (off, _), p in zip(spans, present, strict=True) if p.any()]
    if not starts:
        return None
    end = max(
        int((off + size)[p].max()) for (off, size), p in zip(spans, present, strict=True) if p.any()
    )
    return min(starts) - HEADER, end


def slice_values(
    view: pa.Buffer, base: int, off: np.ndarray, size: np.ndarray, *, nulls: bool
) -> pa.BinaryArray:
    """Component values sliced out of ``view`` (file bytes from ``base``) in bulk, without
    copying each: a binary array of 2n values alternating component and gap over ``view``,
    then every other one.

    Args:
        view: the bytes read.
        base: the file offset of ``view[0]``.
        off: the components' offsets (-1: absent: an empty value).
        size: their sizes.
        nulls: absent components are nulls rather than empty values.

    Returns:
        One value per component, a `pa.binary()` array: a request never holds more than one
        row beyond `READ_BYTES` (`read_groups`), so only a single component can be too large
        for one; a `pa.large_binary()` column instead would change the plan's schema per batch.

    Raises:
        ValueError: ``(message, i)``: component ``i`` is larger than `MAX_VALUE_BYTES` (the
            format raises `DataError` naming the shard and sample).
    """
    too = np.flatnonzero(size > MAX_VALUE_BYTES)
    if len(too):
        raise ValueError(
            f"its {int(size[too[0]])} bytes are more than one binary value holds (2 GiB - 1)",
            int(too[0]),
        )
    missing = off < 0
    if missing.any():
        # An empty value where the previous one ends keeps the offsets ascending.
        ends = np.maximum.accumulate(np.where(missing, 0, off + size - base))
        starts = np.where(missing, np.concatenate([[0], ends[:-1]]), off - base)
        size = np.where(missing, 0, size)
    else:
        starts = off - base
    n = len(off)
    # Offsets into a view of more than 2 GiB (one row's components) need 64 bits; the values
    # taken out of it fit 32-bit offsets again (checked above and by READ_BYTES).
    wide = n > 0 and int((starts + size).max()) > MAX_VALUE_BYTES
    bounds = np.empty(2 * n + 1, np.int64 if wide else np.int32)
    bounds[0:-1:2], bounds[1::2] = starts, starts + size
    bounds[-1] = bounds[-2] if n else 0
    validity = None
    if nulls and missing.any():
        bits = np.repeat(~missing, 2).astype(np.uint8)
        validity = pa.py_buffer(np.packbits(bits, bitorder="little").tobytes())
    both = pa.Array.from_buffers(
        pa.large_binary() if wide else pa.binary(),
        2 * n,
        [validity, pa.py_buffer(bounds.tobytes()), view],
    )
    values = both.take(pa.array(np.arange(0, 2 * n, 2)))
    return values.cast(pa.binary()) if wide else values
