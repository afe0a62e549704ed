"""Counting, at plan time, the rows of each chunk that pass the row filter."""

from __future__ import annotations

import pickle
import threading
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor

from ..formats import Format, ReadOptions
from ..formats.partitions import with_partition
from ..fs import FileSystemSpec
from ..fs.threads import COUNT_THREADS
from ..planning import Chunk

__all__ = ["count_rows"]


def count_rows(
    chunks: Sequence[Chunk], fmt: Format, fs: FileSystemSpec, options: ReadOptions
) -> list[int]:
    """Rows of each chunk that pass ``options.filter``, reading only the columns it needs.

    Counting at plan time is what lets a filtered read keep equal batch counts on every rank
    and resume at a batch (see docs/concepts/model.md). ``options.columns`` should hold just
    the filter's columns.
    """
    expr = options.filter
    local = threading.local()
    blob = pickle.dumps(fmt)  # each thread its own copy: formats cache one open file
    copies: list[Format] = []

    def count(chunk: Chunk) -> int:
        own = getattr(local, "fmt", None)
        if own is None:
            own = local.fmt = pickle.loads(blob)
            copies.append(own)  # list.append is atomic
        total = 0
        for batch in own.read(chunk, 0, chunk.num_rows, fs, options):
            total += with_partition(batch, chunk.partition, options).filter(expr).num_rows
        return total

    try:
        if len(chunks) <= 1:
            return [count(c) for c in chunks]
        with ThreadPoolExecutor(COUNT_THREADS) as pool:
            return list(pool.map(count, chunks))
    finally:
        for copy in copies:
            copy.close()
