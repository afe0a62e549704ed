"""A mixture's stream: each source's part read and shuffled as a one-source stream, then the
batches put together position by position (`planning.mixture`).

A worker's stream is positions ``[a, b)`` of the leg's global sequence. Each source's part of
it is a contiguous range of that source's epoch (`MixEpoch.parts`), read by the source's own
`Reader` and shuffled in the source's blocks (keyed by the source too), in its own thread
(`Prefetcher`). A batch is the next ``batch_size`` positions: the interleave says which source
each holds, the rows are taken from each source's part in order and placed at their positions.
A resumed stream starts each source's part at the rows its delivered positions held.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from ..arrow_values import take
from ..planning import Iteration, Layout, Topology, block_start, consumed, cut, sequence_length
from ..planning.mixture import MixEpoch, Mixture
from .blocks import Segment, shuffled_blocks
from .prefetch import Prefetcher
from .read import Reader

__all__ = ["MixStream", "mixed_segments", "rank_mix_streams", "resolve_mix"]


@dataclass(frozen=True, eq=False)
class MixStream:
    """One worker's stream of a pass over a mixture.

    Attributes:
        topology: the rank and worker that read it.
        iteration: the pass.
        mix: the epoch's rows (each source's, the interleave).
        first: the stream's first position in the leg's sequence.
        length: positions in the stream.
        batches: batches the stream yields in the pass, from its start.
        done: batches it delivered before this pass began (a resume starts there).
    """

    topology: Topology
    iteration: Iteration
    mix: MixEpoch
    first: int
    length: int
    batches: int
    done: int

    @property
    def start(self) -> int:
        """The stream row the pass starts at."""
        return min(self.done * self.mix.layout.batch_size, self.length)


def rank_mix_streams(
    mixture: Mixture, layout: Layout, iteration: Iteration, rank: Topology
) -> tuple[list[int], list[int]]:
    """Batches of each stream of ``rank`` in ``iteration``, and how many each delivered before
    it began (as `stream.resolve.rank_streams` for one source)."""
    mix = mixture.epoch(layout, iteration.epoch, iteration.legs)
    counts = [layout.batches(b - a) for a, b in mixture.spans(mix, rank)]
    return counts, consumed(counts, iteration.batches)


def resolve_mix(
    mixture: Mixture,
    layout: Layout,
    iteration: Iteration,
    topology: Topology,
    *,
    done: int | None = None,
) -> MixStream:
    """The stream ``topology`` reads in ``iteration`` (``done``: as in `stream.resolve.resolve`)."""
    mix = mixture.epoch(layout, iteration.epoch, iteration.legs)
    spans = mixture.spans(mix, topology)
    counts = [layout.batches(b - a) for a, b in spans]
    if done is None:
        done = consumed(counts, iteration.batches)[topology.worker]
    a, b = spans[topology.worker]
    return MixStream(
        topology=topology,
        iteration=iteration,
        mix=mix,
        first=a,
        length=b - a,
        batches=counts[topology.worker],
        done=done,
    )


class _Rows:
    """Rows taken in order from a source part's shuffled blocks."""

    def __init__(self, blocks: Iterator[Segment], schema: pa.Schema, where: str) -> None:
        self._blocks = blocks
        self._schema = schema
        self._where = where
        self._block: pa.RecordBatch | None = None
        self._order: np.ndarray | None = None
        self._at = 0

    def take(self, n: int) -> pa.RecordBatch:
        parts: list[pa.RecordBatch] = []
        while n:
            if self._block is None or self._at >= self._rows():
                segment = next(self._blocks, None)
                if segment is None:
                    raise AssertionError(f"{self._where}: the source's part ended early")
                self._block, self._order = segment
                self._at = 0
            got = min(n, self._rows() - self._at)
            assert self._block is not None
            if self._order is None:
                parts.append(self._block.slice(self._at, got))
            else:
                parts.append(take(self._block, self._order[self._at : self._at + got]))
            self._at += got
            n -= got
        batch = parts[0] if len(parts) == 1 else pa.concat_batches(parts)
        if batch.schema != self._schema:
            batch = batch.select(self._schema.names).cast(self._schema)
        return batch

    def _rows(self) -> int:
        if self._order is not None:
            return len(self._order)
        return self._block.num_rows if self._block is not None else 0


def mixed_segments(
    stream: MixStream,
    readers: Sequence[Reader],
    schema: pa.Schema,
    *,
    source_column: str | None = None,
) -> Iterator[Segment]:
    """The batches of a mixture's ``stream`` before conversion, from where its pass starts.

    ``schema``: the mixture's batches' (each source's rows are cast to it). ``source_column``:
    also a column of each row's source number.
    """
    mix = stream.mix
    layout = mix.layout
    topology, iteration = stream.topology, stream.iteration
    lo, hi = stream.first, stream.first + stream.length
    begin = stream.first + stream.start
    parts = mix.parts(lo, hi)
    starts = (mix.current.prefix(begin) - mix.current.prefix(lo)).tolist()
    k = len(parts)
    prefetchers: list[Prefetcher[Segment]] = []
    rows: list[_Rows | None] = []
    for i, runs in enumerate(parts):
        length = sequence_length(runs)
        if not length or starts[i] >= length:
            rows.append(None)
            continue
        epoch = mix.source_epoch(i)
        source_layout = epoch.layout
        _, first = block_start(length, starts[i], source_layout)
        # (map binds this source's epoch now; a generator expression would look it up later,
        # when the loop has moved on to the last source.)
        pieces = map(epoch.run_pieces, cut(runs, first, length))
        blocks = shuffled_blocks(
            readers[i].read(pieces),
            length,
            source_layout,
            epoch=iteration.epoch,
            stream=topology.stream,
            leg=len(iteration.legs),
            start=starts[i],
            source=i,
        )
        ahead = Prefetcher(blocks, depth=1 if layout.shuffle else 4, name=f"tdu-mix-{i}")
        prefetchers.append(ahead)
        rows.append(_Rows(iter(ahead), schema, f"source {i}"))
    try:
        pos = begin
        while pos < hi:
            n = min(layout.batch_size, hi - pos)
            labels = mix.current.labels(pos, pos + n)
            counts = np.bincount(labels, minlength=k)
            taken = []
            for i, count in enumerate(counts.tolist()):
                if count:
                    source = rows[i]
                    assert source is not None, "a source with positions has rows"
                    taken.append(source.take(count))
            batch = taken[0] if len(taken) == 1 else pa.concat_batches(taken)
            if source_column is not None:
                which = np.repeat(np.arange(k, dtype=np.int64), counts)
                batch = batch.append_column(source_column, pa.array(which))
            # Row r of ``batch`` (grouped by source, in order) goes to position order[r].
            order = np.argsort(labels, kind="stable")
            indices = np.empty(n, np.int64)
            indices[order] = np.arange(n)
            yield batch, indices
            pos += n
    finally:
        for ahead in prefetchers:
            ahead.close()
