"""The WebDataset format's numpy side: chunks of samples, range requests, and component
values sliced out of the bytes read, all from an index held as arrays.

Pure functions of offsets and sizes (no I/O, no errors naming files): the format
(`formats/webdataset.py`) reads the bytes and words the errors.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa

from ..fs.ranges import HOLE_BYTES
from ..planning import Chunk
from .arrays import IndexArrays

if TYPE_CHECKING:  # (formats imports this module)
    from ..formats.base import ReadOptions

__all__ = [
    "CHUNK_BYTES",
    "ShardTable",
    "HEADER",
    "INDEX_ROWS",
    "READ_BYTES",
    "chunks_of",
    "read_groups",
    "requests",
    "slice_values",
    "span_of",
    "unheaded",
]

# Default chunk size (bytes of the selected components) without split_bytes/split_rows: about a
# Parquet row group, so a shard of gigabytes still shuffles and balances in many pieces, while
# a chunk stays far larger than one range request.
CHUNK_BYTES = 32 << 20
# One range request reads at most about this many bytes of consecutive samples (one
# RecordBatch each): large enough to amortise a request, small enough to bound memory.
READ_BYTES = 8 << 20
# Rows per batch when no component bytes are read (only __key__/__url__).
INDEX_ROWS = 65_536
HEADER = 512  # a tar header block, before each member's data
_MAGIC = np.frombuffer(b"ustar", np.uint8)  # at offset 257 of every (ustar/GNU/PAX) header
_MAGIC_AT = 257

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
        self.keys = pa.array(arrays.keys, pa.string())
        sample = arrays.sample_of()
        self.extensions: dict[str, tuple[np.ndarray, np.ndarray]] = {}
        for j, ext in enumerate(arrays.extensions):
            mine = arrays.ext == j
            offsets = np.full(self.num_samples, -1, np.int64)
            sizes = np.zeros(self.num_samples, np.int64)
            offsets[sample[mine]], sizes[sample[mine]] = arrays.offsets[mine], arrays.sizes[mine]
            self.extensions[ext] = (offsets, sizes)
        self._picked: dict[tuple[str, ...], tuple[np.ndarray, np.ndarray]] = {}

    def pick(self, alternatives: tuple[str, ...]) -> tuple[np.ndarray, np.ndarray]:
        """Offsets (-1: absent) and sizes of a column: per sample, the first of the
        ``alternatives`` extensions present."""
        found = self._picked.get(alternatives)
        if found is None:
            offsets = np.full(self.num_samples, -1, np.int64)
            sizes = np.zeros(self.num_samples, np.int64)
            for ext in alternatives:
                have = self.extensions.get(ext)
                if have is not None:
                    take = (offsets < 0) & (have[0] >= 0)
                    offsets[take], sizes[take] = have[0][take], have[1][take]
            found = self._picked[alternatives] = (offsets, sizes)
        return found


def chunks_of(
    path: str,
    kept: np.ndarray,
    sizes: np.ndarray,
    partition: tuple[tuple[str, object], ...],
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


def read_groups(data: Spans, n: int) -> Iterator[tuple[int, int]]:
    """Row ranges read with one request each: consecutive samples whose components span at
    most about `READ_BYTES`, split where a gap of more than ``HOLE_BYTES`` would be read.

    Args:
        data: per selected column, the offsets (-1: absent) and sizes of the ``n`` rows.
        n: the rows.

    Yields:
        ``(lo, hi)`` row ranges, in order, covering all rows (`INDEX_ROWS` at a time when no
        component is selected).
    """
    if not data:
        for lo in range(0, n, INDEX_ROWS):
            yield lo, min(n, lo + INDEX_ROWS)
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


def requests(
    picked: Spans, rows: np.ndarray
) -> Iterator[tuple[np.ndarray, list[tuple[np.ndarray, np.ndarray]], tuple[int, int] | None]]:
    """The range requests that read ``rows`` (sample positions, ascending).

    Args:
        picked: per selected column, offsets and sizes of every sample (`ShardTable.pick`).
        rows: the samples to read.

    Yields:
        Per request (`read_groups`): its rows, the spans (offsets, sizes) of their selected
        components, and its bytes ``(first, end)`` (`span_of`).
    """
    data = [(off[rows], size[rows]) for off, size in picked]
    for lo, hi in read_groups(data, len(rows)):
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


def unheaded(buffer: bytes, base: int, spans: Spans) -> tuple[int, int] | None:
    """The first component not preceded by a tar header in ``buffer`` (file bytes from
    ``base``): the cheap check that a shard still has the layout its index describes.

    Returns:
        ``(column, row)`` of that component, or None when every header is in place.
    """
    data = np.frombuffer(buffer, np.uint8)
    for j, (off, _) in enumerate(spans):
        at = off[off >= 0] - base - HEADER + _MAGIC_AT
        bad = ~(data[at[:, None] + np.arange(len(_MAGIC))] == _MAGIC).all(axis=1)
        if bad.any():
            return j, int(np.flatnonzero(off >= 0)[np.flatnonzero(bad)[0]])
    return None


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
        One value per component.
    """
    missing = off < 0
    if missing.any():
        # An empty value where the previous one ends keeps the offsets ascending.
        ends = np.maximum.accumulate(np.where(missing, 0, off + size - base))
        starts = np.where(missing, np.concatenate([[0], ends[:-1]]), off - base)
        size = np.where(missing, 0, size)
    else:
        starts = off - base
    n = len(off)
    bounds = np.empty(2 * n + 1, np.int32)
    bounds[0:-1:2], bounds[1::2] = starts, starts + size
    bounds[-1] = bounds[-2]
    validity = None
    if nulls and missing.any():
        bits = np.repeat(~missing, 2).astype(np.uint8)
        validity = pa.py_buffer(np.packbits(bits, bitorder="little").tobytes())
    both = pa.BinaryArray.from_buffers(
        pa.binary(), 2 * n, [validity, pa.py_buffer(bounds.tobytes()), view]
    )
    return both.take(pa.array(np.arange(0, 2 * n, 2)))
