"""One stream from its runs to batches: each source's rows read → blocks (shuffled) → read
ahead, then batches cut (one source) or interleaved position by position (a mixture)."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Sequence

import pyarrow as pa
from torch.utils.data import get_worker_info

from ..errors import DataError
from ..planning import block_start, cut, strategy_of
from ..planning.streams import SourceRows, Stream
from .batches import cut_batches
from .blocks import BLOCK_PARTS, BLOCK_PARTS_MIN_BATCH, Segment, permuted_whole, shuffled_blocks
from .budget import budget_batches
from .mix import interleaved
from .prefetch import Prefetcher
from .read import Reads

__all__ = ["stream_segments"]


def stream_segments(
    stream: Stream,
    readers: Sequence[Reads],
    *,
    schema: pa.Schema | None = None,
    source_column: str | None = None,
) -> Iterator[Segment]:
    """The batches of ``stream`` before conversion, from where its pass starts: each a record
    batch and the indices of its rows in output order (``None``: all, in order).

    ``readers``: one per source of the stream (`Stream.sources`). A mixture's: ``schema``, its
    batches' (each source's rows are cast to it), and ``source_column``, as `interleaved` takes
    them.

    Raises:
        DataError: a block or batch holds more than a 32-bit offset column can address.
    """
    layout = stream.layout
    # A lone source's block may stay several read batches (no copy); a mixture's sources'
    # blocks are joined into one record batch to gather from (`stream.mix`), so each is one.
    # Blocks of flat columns, permuted whole here or as a mixture's sources load them, stay
    # in their parts whatever their number: the permutation is their one copy.
    alone = stream.interleave is None and layout.batch_size >= BLOCK_PARTS_MIN_BATCH
    parts = BLOCK_PARTS if alone else 1
    whole = alone or stream.interleave is not None
    aheads: list[Prefetcher[Segment] | None] = [
        _read_ahead(stream, rows, reader, parts, whole)
        for rows, reader in zip(stream.sources, readers, strict=True)
    ]
    try:
        if stream.interleave is None:
            (ahead,) = aheads
            assert ahead is not None, "a stream of one source reads it"
            # Batch-aligned streams already left only whole batches under drop_last;
            # round-robin's streams of whole chunks drop their own last short batch.
            drop_short = layout.drop_last and not strategy_of(layout.strategy).batch_aligned
            # Blocks of big batches are permuted whole on this thread, the next read meanwhile.
            blocks = permuted_whole(ahead) if alone else ahead
            batches = cut_batches(blocks, layout.batch_size, drop_short=drop_short)
            if stream.budget is not None:  # the batches are groups, cut under a token budget
                batches = budget_batches(batches, stream.budget, where=_recent(readers[0]))
            yield from batches
        else:
            assert schema is not None, "a mixture's batches have a schema"
            yield from interleaved(
                [iter(a) if a is not None else None for a in aheads],
                stream.interleave,
                (stream.first + stream.start, stream.first + stream.length),
                layout.batch_size,
                schema,
                where=[_recent(r) for r in readers],
                source_column=source_column,
            )
    except pa.ArrowInvalid as exc:
        if "overflow" not in str(exc):
            raise
        # A string, binary or list column's 32-bit offsets cannot hold the block or batch.
        files = ", ".join(f for r in readers for f in r.recent_files())
        raise DataError(
            f"{files}: a shuffle block or batch of these rows holds more than 2 GiB in one "
            "string, binary or list column, more than its 32-bit offsets address "
            f"({exc}); read with a smaller batch_size (and shuffle_block_bytes), or write the "
            "column as large_string/large_binary"
        ) from exc
    finally:
        for ahead in aheads:
            if ahead is not None:
                ahead.close()


def _read_ahead(
    stream: Stream, rows: SourceRows, reader: Reads, parts: int, whole: bool
) -> Prefetcher[Segment] | None:
    """The shuffled blocks of ``rows`` from where the pass starts, read ahead in a thread
    (``None``: the pass reads none of them)."""
    if stream.interleave is not None and (not rows.length or rows.start >= rows.length):
        return None
    layout = rows.order.layout
    # A resumed stream re-reads the block it stopped in and skips the rows it delivered.
    _, first = block_start(rows.length, rows.start, layout)
    # (map binds this source's epoch now.)
    pieces = map(rows.order.run_pieces, cut(rows.runs, first, rows.length))
    pass_ = stream.pass_
    # The first batch waits for the pass's first block (unshuffled: its own rows); a format
    # may decode those sooner (docs/adr/0020-measurements-behind-constants.md#first-blocks).
    soon = layout.batch_size
    if layout.shuffle:  # (a resumed pass's first block is not the first one: none)
        soon = 0 if rows.start else layout.first_block_rows
    blocks = shuffled_blocks(
        reader.read(pieces, first_rows=soon),
        rows.length,
        layout,
        epoch=pass_.epoch,
        stream=stream.topology.stream,
        leg=len(pass_.legs),
        start=rows.start,
        source=rows.index,
        parts=parts,
        whole=whole,
    )
    # The thread reads and assembles whole blocks while this one gathers, converts and packs
    # the previous block. Memory: the block being gathered and the next one being assembled.
    name = "tdu-prefetch" if rows.index is None else f"tdu-mix-{rows.index}"
    depth = 1 if stream.layout.shuffle else 4
    return Prefetcher(blocks, depth=depth, name=name, thread=_thread_pays(reader))


def _thread_pays(reader: Reads) -> bool:
    """Whether a thread reading ahead pays: always in the main process, and from object
    storage (it overlaps the waits). A worker reading local files on a machine whose cores the
    workers (of every local rank) all take has no core for it: the thread only takes turns with
    the worker's conversion, 5-7% more CPU and no faster
    (docs/adr/0020-measurements-behind-constants.md#the-prefetch-thread)."""
    info = get_worker_info()
    if info is None or not reader.local:
        return True
    try:
        ranks = max(1, int(os.environ.get("LOCAL_WORLD_SIZE", "1")))
    except ValueError:
        ranks = 1
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return (cores or 1) > info.num_workers * ranks


def _recent(reader: Reads) -> Callable[[], str]:
    """What names ``reader``'s recent files in an error."""
    return lambda: ", ".join(reader.recent_files())
