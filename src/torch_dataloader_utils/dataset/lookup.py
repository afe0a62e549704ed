"""Any batch's rows, from the plan (`Lookup.rows_at`): which rank's worker delivers batch ``b``,
which rows of its stream that batch holds, where they are in the files, read on demand.

The epoch's order is a pure function of the plan and the layout (docs/concepts/model.md), so
the rows of a batch follow without iterating: the leg of the epoch that delivered it (an
elastic resume starts a new one), the worker from the round robin's counts
(`planning.resume.consumed`), each source's rows of the stream through its blocks'
permutations (a mixture's sources from the interleave), their chunks from the epoch's chunk
order; one read of each chunk they are in, of the columns asked for (none: no read).
"""

from __future__ import annotations

import dataclasses
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa

from ..batching import Packing
from ..errors import InvalidArgumentError
from ..planning import Pass, Topology, consumed
from ..planning.budget import Lengths, equalised, group_batches, split_done
from ..planning.sequence import Run
from ..planning.streams import SourceRows, Stream, Streams
from ..stream.fragments import Fragments
from .chunk_rows import FILE_COLUMN, ROW_COLUMN, SOURCE_COLUMN, ChunkRows
from .packed_lookup import FRAGMENT_START, FRAGMENT_TOKENS, packed_rows

__all__ = [
    "FILE_COLUMN",
    "FRAGMENT_START",
    "FRAGMENT_TOKENS",
    "ROW_COLUMN",
    "SOURCE_COLUMN",
    "Lookup",
]


@dataclass(eq=False)
class Lookup:
    """Looks up the rows of a dataset's batches, keeping what lookups share: the streams of the
    rank's workers in the pass looked up last, the chunks' rows in their files, a packed
    stream's last blocks.

    Attributes:
        streams: the dataset's streams (the current leg's layout).
        rows: the rows of its sources' chunks.
        packing: a packed dataset's `Packing`.
    """

    streams: Streams
    rows: ChunkRows
    packing: Packing | None = None
    # A packed stream's blocks looked up last, by stream and block (`packed_lookup`).
    blocks: OrderedDict[tuple[Any, ...], Fragments] = field(default_factory=OrderedDict)
    _pass: tuple[Any, ...] = ()
    _counts: list[int] = field(default_factory=list)
    _streams: dict[int, Stream] = field(default_factory=dict)

    def rows_at(
        self,
        batch: int,
        *,
        pass_: Pass,
        ranks: tuple[int, int, int],
        columns: Sequence[str] | None = None,
    ) -> pa.Table:
        """The rows of a rank's batch ``batch`` of ``pass_``'s epoch, in delivered order,
        with each row's file (`FILE_COLUMN`), row number in it (`ROW_COLUMN`) and, in a
        mixture, source (`SOURCE_COLUMN`).

        Batches are numbered from the epoch's first on the rank, every leg's in turn: after an
        elastic resume, those of the earlier topologies (``pass_.legs``), then the current
        one's. So the rows are those delivered when ``pass_`` is the pass that delivered
        them: `Passes.numbered` gives the pass loaded, being read or read last of the epoch,
        with its legs; for an epoch it holds none of, a fresh pass on the current topology,
        which a loader before a loaded state may not have read (it may have had other ranks).
        ``ranks``: the rank, the world size and the rank's DataLoader workers in the current
        leg. ``columns``: the data columns read (``None``: the dataset's; a packed
        dataset's: none); with a row filter, a chunk's filter columns are read once more, for
        the rows' numbers.

        Packed sequences: the fragments of documents each batch holds (`packed_rows`).

        Raises:
            InvalidArgumentError: no such rank or batch, or the rank had none in the leg that
                delivered it.
            ColumnNotFoundError: a column asked for is not in the data.
        """
        rank, world_size, workers = ranks
        if not 0 <= rank < world_size:
            raise InvalidArgumentError(f"rank must be in [0, {world_size}), got {rank}")
        here = Topology(rank, world_size, 0, workers)
        streams, pass_, topology, leg_batch = self._leg(batch, pass_, here)
        stream, index = self._batch_stream(streams, leg_batch, pass_, topology, batch)
        if stream.balanced is not None:  # another stream's batch (planning.balanced)
            source, index = (int(x) for x in stream.balanced.picks[index])
            stream = stream.balanced.sources[source]
        wanted = None if columns is None else self.rows.checked(columns)
        if streams.lengths is not None:  # a token budget's: some rows of a group
            return self._budget_rows(streams.lengths, stream, index, wanted)
        if stream.layout.seq_tokens:  # packed sequences: the documents' fragments it holds
            assert self.packing is not None, "a packed dataset's layout has seq_tokens"
            return packed_rows(
                stream,
                index,
                rows=self.rows,
                packing=self.packing,
                blocks=self.blocks,
                columns=wanted or (),  # (its rows are tokens: no data column unless asked)
            )
        return self._rows(stream, index, wanted)

    # --- which stream delivers a batch ---------------------------------------------------------

    def _leg(self, batch: int, pass_: Pass, rank: Topology) -> tuple[Streams, Pass, Topology, int]:
        """The leg of ``pass_`` that delivered the rank's batch ``batch``: its streams, its
        pass, the rank's topology then, and the batch's number in the leg."""
        before = 0
        for depth, leg in enumerate(pass_.legs):
            if 0 <= batch < before + leg.batches:
                if rank.rank >= leg.world_size:
                    raise InvalidArgumentError(
                        f"batch {batch} of epoch {pass_.epoch} was delivered before an "
                        f"elastic resume, by {leg.world_size} ranks: rank {rank.rank} was not "
                        "one of them"
                    )
                earlier = Pass(pass_.epoch, pass_.legs[:depth], steps=pass_.steps)
                then = Topology(rank.rank, leg.world_size, 0, leg.num_workers)
                return self.streams.with_layout(leg.layout), earlier, then, batch - before
            before += leg.batches
        now = dataclasses.replace(pass_, batches=0, generation=0)
        return self.streams, now, rank, batch - before

    def _batch_stream(
        self, streams: Streams, batch: int, pass_: Pass, rank: Topology, asked: int
    ) -> tuple[Stream, int]:
        """The stream that delivers the rank's batch ``batch`` of the leg ``pass_`` reads, and
        which of its batches that is (``asked``: the batch's number in the epoch).

        Raises:
            InvalidArgumentError: the rank has no such batch.
        """
        key = (streams.layout, pass_.epoch, pass_.legs, pass_.steps, rank)
        # A pass's streams, resolved once for all its batches (a mixture's are slow to resolve:
        # docs/adr/0020-measurements-behind-constants.md#looking-up-rows).
        if key != self._pass:
            self._pass, self._streams = key, {}
            self._counts = streams.rank_streams(pass_, rank)[0]
        counts = self._counts
        if not 0 <= batch < sum(counts):
            total = asked - batch + sum(counts)
            raise InvalidArgumentError(
                f"batch {asked} is not a batch of rank {rank.rank} in epoch {pass_.epoch}: it "
                f"has {total} (0 to {total - 1})"
            )
        # DataLoader's order: round robin over the workers that have batches left.
        done = consumed(counts, batch)
        worker = min((d, w) for w, (d, n) in enumerate(zip(done, counts, strict=True)) if d < n)[1]
        topology = Topology(rank.rank, rank.world_size, worker, rank.num_workers)
        stream = self._streams.get(worker)
        if stream is None:
            stream = self._streams[worker] = streams.resolve(pass_, topology, done=0)
        return stream, done[worker]

    # --- the rows of a batch -------------------------------------------------------------------

    def _rows(self, stream: Stream, index: int, columns: Sequence[str] | None) -> pa.Table:
        """Batch ``index`` of ``stream`` (one source, or a mixture's)."""
        size = stream.layout.batch_size
        first = index * size
        count = min(size, stream.length - first)
        if stream.interleave is None:
            labels = np.zeros(count, np.int64)
            before = [first]
        else:  # which source each position holds, and each source's rows before the batch
            at = stream.first + first
            labels = stream.interleave.labels(at, at + count).astype(np.int64)
            before = (
                stream.interleave.prefix(at) - stream.interleave.prefix(stream.first)
            ).tolist()
        tables = []
        for rows in stream.sources:
            i = rows.index or 0
            mine = int(np.count_nonzero(labels == i))
            if not mine:
                continue
            offsets = np.arange(before[i], before[i] + mine)
            positions = delivered(stream, rows, offsets)
            table = self.rows.table(i, *_chunk_rows(rows, positions), columns)
            if stream.interleave is not None:
                table = table.append_column(SOURCE_COLUMN, pa.array(np.full(mine, i), pa.int64()))
            tables.append((i, table))
        if len(tables) == 1:
            return tables[0][1]
        # Each source's rows, in its order, go to the positions the interleave gave it.
        joined = pa.concat_tables([t for _, t in tables], promote_options="permissive")
        starts = np.cumsum([0, *(t.num_rows for _, t in tables)])
        order = np.empty(count, np.int64)
        for (source, _), start in zip(tables, starts.tolist(), strict=False):
            placed = np.flatnonzero(labels == source)
            order[placed] = start + np.arange(len(placed))
        return joined.take(pa.array(order))

    def _budget_rows(
        self, lengths: Lengths, stream: Stream, index: int, columns: Sequence[str] | None
    ) -> pa.Table:
        """Token-budget batch ``index`` of ``stream``: its group's rows, sorted by length and cut
        as `stream.budget.budget_batches` cuts them, from the length index ``lengths``."""
        budget = stream.budget
        assert budget is not None, "a token budget's stream counts its groups' batches"
        group, within = split_done(np.asarray(budget.counts), index)
        (rows,) = stream.sources
        size = stream.layout.batch_size
        offsets = np.arange(group * size, min((group + 1) * size, rows.length))
        positions = delivered(stream, rows, offsets)
        chunks, kept = _chunk_rows(rows, positions)
        starts = np.cumsum(lengths.chunk_rows) - lengths.chunk_rows
        order, bounds = group_batches(lengths.values[starts[chunks] + kept], lengths.max_tokens)
        bounds = equalised(bounds, int(budget.counts[group]))
        taken = positions[order[bounds[within] : bounds[within + 1]]]
        return self.rows.table(0, *_chunk_rows(rows, taken), columns)


def delivered(stream: Stream, rows: SourceRows, offsets: np.ndarray) -> np.ndarray:
    """The sequence positions of ``rows``' stream rows delivered ``offsets``-th (counted in
    the order the stream delivers them), through the permutations of their blocks."""
    return _positions(rows.runs, stream.order_of(rows).delivered(offsets))


def _positions(runs: Sequence[Run], offsets: np.ndarray) -> np.ndarray:
    """The sequence positions of the stream rows ``offsets`` (``runs``: the stream's)."""
    lengths = np.asarray([run.num_rows for run in runs], dtype=np.int64)
    ends = np.cumsum(lengths)
    which = np.searchsorted(ends, offsets, side="right")
    out = np.empty(len(offsets), np.int64)
    for i in np.unique(which).tolist():
        mine = which == i
        inside = offsets[mine] - (ends[i] - lengths[i])
        out[mine] = runs[i].positions(inside)
    return out


def _chunk_rows(rows: SourceRows, positions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The chunk of each of ``positions`` of ``rows``' epoch sequence, and its row in it
    (counted after the filter)."""
    order = rows.order
    ends = order.ends
    at = np.searchsorted(ends, positions, side="right")
    return order.order[at], positions - (ends[at] - order.rows[at])
