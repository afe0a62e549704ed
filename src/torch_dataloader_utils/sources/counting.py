"""Counting at plan time: the rows of each chunk that pass the row filter, and the tokens of a
list column (a packed dataset's order is one of tokens)."""

from __future__ import annotations

import pickle
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ..convert.arrow_values import null_marked
from ..formats import Format, ReadOptions
from ..formats.partitions import with_partition
from ..fs import FileSystemSpec
from ..fs.threads import COUNT_THREADS
from ..planning import Chunk

__all__ = ["count_lengths", "count_rows", "count_tokens", "in_threads", "tokens_of_lengths"]

_T = TypeVar("_T")
_I = TypeVar("_I")


def count_rows(
    chunks: Sequence[Chunk], fmt: Format, fs: FileSystemSpec, options: ReadOptions
) -> list[int]:
    """Rows of each chunk that pass ``options.filter``, reading only the columns it needs.

    Counting at plan time is what lets a filtered read keep equal batch counts on every rank
    and resume at a batch (see docs/concepts/model.md). ``options.columns`` should hold just
    the filter's columns.
    """
    return _each_chunk(chunks, fmt, fs, options, lambda batch: batch.num_rows)


def count_tokens(
    chunks: Sequence[Chunk],
    fmt: Format,
    fs: FileSystemSpec,
    options: ReadOptions,
    column: str,
    *,
    eos: bool = False,
    told: Sequence[tuple[int, int | None] | None] | None = None,
) -> list[int]:
    """Values of the list column ``column`` in the rows of each chunk that pass
    ``options.filter`` (a null list holds none), and with ``eos`` one more for each list that is
    not null; reading ``options.columns`` (``column`` and the filter's columns).

    ``told``: what the format's metadata told of each chunk (`FormatPlan.token_counts`, the same
    counts, without a filter): the chunks it tells are not read.
    """

    def tokens(batch: pa.RecordBatch) -> int:
        lists = batch.column(column)
        values = int(pc.sum(pc.list_value_length(lists)).as_py() or 0)
        return values + (len(lists) - lists.null_count if eos else 0)

    counts = [-1] * len(chunks)  # -1: to count by reading
    if told is not None and options.filter is None:
        for i, one in enumerate(told):
            if one is not None:
                values, lists = one
                if not eos:
                    counts[i] = values
                elif lists is not None:
                    counts[i] = values + lists
    unread = [i for i, n in enumerate(counts) if n < 0]
    read = _each_chunk([chunks[i] for i in unread], fmt, fs, options, tokens)
    for i, n in zip(unread, read, strict=True):
        counts[i] = n
    return counts


def count_lengths(
    chunks: Sequence[Chunk], fmt: Format, fs: FileSystemSpec, options: ReadOptions, column: str
) -> list[np.ndarray]:
    """The length of each list of ``column`` (a null list: -1, as
    `planning.pack_lengths.document_tokens` takes it) in the rows of each chunk that pass
    ``options.filter`` (int32; the length index of a token budget or a balanced packing)."""

    def lengths(batch: pa.RecordBatch) -> np.ndarray:
        return null_marked(batch.column(column))

    def joined(parts: list[np.ndarray]) -> np.ndarray:
        return np.concatenate(parts) if parts else np.zeros(0, np.int32)

    return _each_chunk(chunks, fmt, fs, options, lengths, combine=joined)


def tokens_of_lengths(lengths: Sequence[np.ndarray], *, eos: bool = False) -> list[int]:
    """Each chunk's tokens (`count_tokens`' counts) from its rows' lengths (`count_lengths`':
    a null list -1), so a column whose lengths are read anyway is not read twice."""
    return [
        int(np.maximum(one, 0).sum()) + (int((one >= 0).sum()) if eos else 0) for one in lengths
    ]


def _each_chunk(
    chunks: Sequence[Chunk],
    fmt: Format,
    fs: FileSystemSpec,
    options: ReadOptions,
    measure: Callable[[pa.RecordBatch], _T],
    *,
    combine: Callable[[list[_T]], _T] = sum,  # type: ignore[assignment]
) -> list[_T]:
    """``measure`` of the filtered batches of each chunk (``combine``d: summed), chunks read in
    threads."""
    expr = options.filter

    def count(chunk: Chunk, own: Format) -> _T:
        parts = []
        for read in own.read(chunk, 0, chunk.num_rows, fs, options):
            batch = with_partition(read, chunk.partition, options)
            parts.append(measure(batch.filter(expr) if expr is not None else batch))
        return combine(parts)

    return in_threads(chunks, fmt, count, COUNT_THREADS)


def in_threads(
    items: Sequence[_I], fmt: Format, work: Callable[[_I, Format], _T], threads: int
) -> list[_T]:
    """``work(item, fmt)`` for each of ``items``, in order, in up to ``threads`` threads (here
    when one will do), each thread with its own copy of ``fmt`` (formats cache one open file),
    the copies closed at the end."""
    local = threading.local()
    blob = pickle.dumps(fmt)
    copies: list[Format] = []

    def run(item: _I) -> _T:
        own = getattr(local, "fmt", None)
        if own is None:
            own = local.fmt = pickle.loads(blob)
            copies.append(own)  # list.append is atomic
        return work(item, own)

    try:
        if len(items) <= 1 or threads <= 1:
            return [run(item) for item in items]
        with ThreadPoolExecutor(min(threads, len(items))) as pool:
            return list(pool.map(run, items))
    finally:
        for copy in copies:
            copy.close()
