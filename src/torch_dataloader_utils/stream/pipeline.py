"""One stream from its runs to batches: read → blocks (shuffled) → read ahead → batches."""

from __future__ import annotations

from collections.abc import Iterator

import pyarrow as pa

from ..errors import DataError
from ..planning import block_start, cut, strategy_of
from .batches import cut_batches
from .blocks import BLOCK_PARTS, BLOCK_PARTS_MIN_BATCH, Segment, shuffled_blocks
from .prefetch import Prefetcher
from .read import Reader
from .resolve import Stream

__all__ = ["stream_segments"]


def stream_segments(stream: Stream, reader: Reader) -> Iterator[Segment]:
    """The batches of ``stream`` before conversion, from where its pass starts: each a record
    batch and the indices of its rows in output order (``None``: all, in order).

    Raises:
        DataError: a block or batch holds more than a 32-bit offset column can address.
    """
    epoch = stream.epoch
    layout = epoch.layout
    start = stream.start
    # A resumed stream re-reads the block it stopped in and skips the rows it delivered.
    _, first = block_start(stream.length, start, layout)
    parts = (epoch.run_pieces(run) for run in cut(stream.runs, first, stream.length))
    iteration = stream.iteration
    blocks = shuffled_blocks(
        reader.read(parts),
        stream.length,
        layout,
        epoch=iteration.epoch,
        stream=stream.topology.stream,
        leg=len(iteration.legs),
        start=start,
        parts=BLOCK_PARTS if layout.batch_size >= BLOCK_PARTS_MIN_BATCH else 1,
    )
    # The thread reads and assembles whole blocks while this one gathers, converts
    # and packs the previous block. A queue of read batches instead let the reader get only
    # a little ahead of a block, and the two alternated (measured: ~25% of a worker idle).
    # Memory: the block being gathered and the next one being assembled.
    ahead = Prefetcher(blocks, depth=1 if layout.shuffle else 4)
    # Batch-aligned streams already left only whole batches under drop_last; round-robin's
    # streams of whole chunks drop their own last short batch.
    drop_short = layout.drop_last and not strategy_of(layout.strategy).batch_aligned
    try:
        yield from cut_batches(ahead, layout.batch_size, drop_short=drop_short)
    except pa.ArrowInvalid as exc:
        if "overflow" not in str(exc):
            raise
        # A string, binary or list column's 32-bit offsets cannot hold the block or batch.
        raise DataError(
            f"{', '.join(reader.recent_files())}: a shuffle block or batch of these rows "
            "holds more than 2 GiB in one string, binary or list column, more than its "
            f"32-bit offsets address ({exc}); read with a smaller batch_size (and "
            "shuffle_block_bytes), or write the column as large_string/large_binary"
        ) from exc
