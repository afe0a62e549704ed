"""Any batch's rows, from the plan (`rows_at`): which rank's worker delivers batch ``b``, which
rows of its stream that batch holds, where they are in the files, read on demand.

The epoch's order is a pure function of the plan and the layout (docs/concepts/model.md), so
the rows of a batch follow without iterating: the worker from the round robin's counts
(`planning.resume.consumed`), the stream's rows from its blocks' permutations, their chunks
from the epoch's chunk order; one read of each chunk they are in.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pyarrow as pa

from ..convert.arrow_values import take
from ..errors import InvalidArgumentError
from ..fs import FileSystemSpec
from ..planning import Iteration, Piece, Plan, Topology, block_permutation, consumed
from ..planning.sequence import Run
from ..planning.shuffle import block_of
from ..planning.streams import OneSource, Streams
from ..stream.read import Reads

__all__ = ["FILE_COLUMN", "ROW_COLUMN", "batch_rows", "rows_at"]

# The columns `rows_at` adds: each row's file (its URL) and its row number in that file.
FILE_COLUMN, ROW_COLUMN = "__file__", "__row__"


def batch_rows(
    streams: Streams, batch: int, *, epoch: int, rank: int, world_size: int, workers: int
) -> tuple[Topology, np.ndarray]:
    """The stream that delivers batch ``batch`` of ``rank`` in a fresh pass over ``epoch``,
    and the positions of the epoch's row sequence its rows hold, in delivered order.

    Raises:
        InvalidArgumentError: the rank has no such batch.
    """
    topology = Topology(rank, world_size, 0, workers)
    counts, _ = streams.rank_streams(Iteration(epoch), topology)
    if not 0 <= batch < sum(counts):
        raise InvalidArgumentError(
            f"batch {batch} is not a batch of rank {rank} in epoch {epoch}: it has "
            f"{sum(counts)} (0 to {sum(counts) - 1})"
        )
    # DataLoader's order: round robin over the workers that have batches left.
    done = consumed(counts, batch)
    worker = min((d, w) for w, (d, n) in enumerate(zip(done, counts, strict=True)) if d < n)[1]
    stream_topology = Topology(rank, world_size, worker, workers)
    stream = streams.resolve(Iteration(epoch), stream_topology, done=0)
    (rows,) = stream.sources
    layout = stream.layout
    first = done[worker] * layout.batch_size
    offsets = np.arange(first, min(first + layout.batch_size, rows.length))
    if layout.shuffle:  # through the permutation of each block they are in (one or two)
        out = np.empty_like(offsets)
        left = np.ones(len(offsets), bool)
        while left.any():
            index, start, stop = block_of(
                int(offsets[left][0]),
                rows.length,
                block_rows=layout.block_rows,
                first_block_rows=layout.first_block_rows,
            )
            mine = left & (offsets >= start) & (offsets < stop)
            perm = _permutation(epoch, stream_topology.stream, index, stop - start, layout.seed)
            out[mine] = start + perm[offsets[mine] - start]
            left &= ~mine
        offsets = out
    return stream_topology, _positions(rows.runs, offsets)


def _permutation(epoch: int, stream: int, block: int, n: int, seed: int) -> np.ndarray:
    return block_permutation(seed=seed, epoch=epoch, stream=stream, block=block, n=n)


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


def rows_at(
    streams: Streams,
    plan: Plan,
    reader: Reads,
    fs: FileSystemSpec,
    batch: int,
    *,
    epoch: int,
    rank: int,
    world_size: int,
    workers: int,
) -> pa.Table:
    """The rows of batch ``batch`` of ``rank`` in ``epoch``, in delivered order, with each
    row's file (`FILE_COLUMN`) and row number in it (`ROW_COLUMN`); one read of each chunk
    they are in (with ``reader``; ``fs`` names the files).

    Raises:
        InvalidArgumentError: no such batch, or batches that are not rows of one source (a
            mixture, packed sequences, token budgets, a row filter: not built yet).
    """
    if not isinstance(streams, OneSource) or streams.layout.unit or plan.filtered_rows:
        raise InvalidArgumentError(
            "rows_at looks up the batches of one source's rows; a mixture's, packed "
            "sequences', token budgets' and a row filter's are not built yet"
        )
    _, positions = batch_rows(
        streams, batch, epoch=epoch, rank=rank, world_size=world_size, workers=workers
    )
    epoch_rows = streams.rows(Iteration(epoch))
    ends = epoch_rows.ends
    at = np.searchsorted(ends, positions, side="right")
    chunks = epoch_rows.order[at]
    rows = positions - (ends[at] - epoch_rows.rows[at])
    parts: list[pa.RecordBatch] = []
    taken = np.empty(len(positions), np.int64)
    files: list[str] = [""] * len(positions)
    file_rows = np.empty(len(positions), np.int64)
    first_rows = _first_rows(plan)
    base = 0
    for chunk in np.unique(chunks).tolist():
        mine = np.flatnonzero(chunks == chunk)
        wanted = rows[mine]
        lo, hi = int(wanted.min()), int(wanted.max()) + 1
        read = list(reader.read([([Piece(chunk, lo, hi)], None)]))
        block = pa.concat_batches(read) if len(read) != 1 else read[0]
        parts.append(block)
        taken[mine] = base + (wanted - lo)
        base += block.num_rows
        url = fs.url(plan.chunks.paths[int(plan.chunks.column("file")[chunk])])
        for i in mine.tolist():
            files[i] = url
        file_rows[mine] = first_rows[chunk] + wanted
    table = pa.Table.from_batches(parts) if parts else pa.table({})
    out = pa.Table.from_batches([take(table.combine_chunks().to_batches()[0], taken)])
    out = out.append_column(FILE_COLUMN, pa.array(files, pa.string()))
    return out.append_column(ROW_COLUMN, pa.array(file_rows, pa.int64()))


def _first_rows(plan: Plan) -> np.ndarray:
    """Each chunk's first row in its file: the rows of the file's chunks before it (a file's
    chunks are consecutive in the plan, in file order)."""
    files, rows = plan.chunks.column("file"), plan.chunks.num_rows
    before = np.cumsum(rows) - rows
    opens = np.ones(len(files), bool)
    opens[1:] = files[1:] != files[:-1]
    first = np.maximum.accumulate(np.where(opens, np.arange(len(files)), 0))
    out: np.ndarray = before - before[first]
    return out
