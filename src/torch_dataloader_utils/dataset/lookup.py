"""Any batch's rows, from the plan (`rows_at`): which rank's worker delivers batch ``b``, which
rows of its stream that batch holds, where they are in the files, read on demand.

The epoch's order is a pure function of the plan and the layout (docs/concepts/model.md), so
the rows of a batch follow without iterating: the worker from the round robin's counts
(`planning.resume.consumed`), each source's rows of the stream through its blocks'
permutations (a mixture's sources from the interleave), their chunks from the epoch's chunk
order; one read of each chunk they are in.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence

import numpy as np
import pyarrow as pa

from ..convert.arrow_values import take
from ..errors import InvalidArgumentError
from ..formats.partitions import with_partition
from ..planning import Iteration, Piece, Topology, block_permutation, consumed
from ..planning.budget import equalised, group_batches, split_done
from ..planning.sequence import Run, cut
from ..planning.shuffle import block_of, document_permutation
from ..planning.streams import Budgeted, Mixed, OneSource, SourceRows, Stream, Streams
from ..sources.planned import PlannedSource
from ..stream.fragments import Fragments
from ..stream.read import Reads

__all__ = ["FILE_COLUMN", "ROW_COLUMN", "SOURCE_COLUMN", "rows_at"]

# The columns `rows_at` adds: each row's file (its URL), its row number in that file, and (a
# mixture's) its source.
FILE_COLUMN, ROW_COLUMN, SOURCE_COLUMN = "__file__", "__row__", "__source__"


def _batch_stream(
    streams: Streams, batch: int, *, pass_: Iteration, rank: int, world_size: int, workers: int
) -> tuple[Stream, int]:
    """The stream that delivers batch ``batch`` of ``rank`` in a fresh pass over ``epoch``,
    and which of its batches that is.

    Raises:
        InvalidArgumentError: the rank has no such batch.
    """
    topology = Topology(rank, world_size, 0, workers)
    epoch = pass_.epoch
    counts, _ = streams.rank_streams(pass_, topology)
    if not 0 <= batch < sum(counts):
        raise InvalidArgumentError(
            f"batch {batch} is not a batch of rank {rank} in epoch {epoch}: it has "
            f"{sum(counts)} (0 to {sum(counts) - 1})"
        )
    # DataLoader's order: round robin over the workers that have batches left.
    done = consumed(counts, batch)
    worker = min((d, w) for w, (d, n) in enumerate(zip(done, counts, strict=True)) if d < n)[1]
    stream_topology = Topology(rank, world_size, worker, workers)
    return streams.resolve(pass_, stream_topology, done=0), done[worker]


def _delivered(stream: Stream, rows: SourceRows, offsets: np.ndarray) -> np.ndarray:
    """The sequence positions of ``rows``' stream rows delivered ``offsets``-th (counted in
    the order the stream delivers them), through the permutations of their blocks."""
    layout = rows.epoch_rows.layout
    if layout.shuffle:
        out = np.empty_like(offsets)
        left = np.ones(len(offsets), bool)
        while left.any():  # (a batch is in one or two blocks)
            index, start, stop = block_of(
                int(offsets[left][0]),
                rows.length,
                block_rows=layout.block_rows,
                first_block_rows=layout.first_block_rows,
            )
            mine = left & (offsets >= start) & (offsets < stop)
            perm = block_permutation(
                seed=layout.seed,
                epoch=stream.iteration.epoch,
                stream=stream.topology.stream,
                block=index,
                n=stop - start,
                source=rows.source,
            )
            out[mine] = start + perm[offsets[mine] - start]
            left &= ~mine
        offsets = out
    return _positions(rows.runs, offsets)


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
    sources: Sequence[PlannedSource],
    readers: Callable[[int], Reads],
    batch: int,
    *,
    epoch: Iteration,
    rank: int,
    world_size: int,
    workers: int,
) -> pa.Table:
    """The rows of batch ``batch`` of ``rank`` in a fresh pass over ``epoch``, in delivered
    order, with each row's file (`FILE_COLUMN`), row number in it (`ROW_COLUMN`) and, in a
    mixture, source (`SOURCE_COLUMN`); one read of each chunk they are in (``readers(i)``:
    source ``i``'s reader; with a row filter, the chunk's filter columns once more, for the
    rows' numbers).

    Packed sequences: the pieces of documents each batch holds (`_packed_rows`).

    Raises:
        InvalidArgumentError: no such batch.
    """
    assert isinstance(streams, OneSource | Mixed | Budgeted), "every dataset's streams"
    stream, index = _batch_stream(
        streams, batch, pass_=epoch, rank=rank, world_size=world_size, workers=workers
    )
    if isinstance(streams, Budgeted):  # a token budget's: part of a group of rows
        return _budget_rows(streams, stream, index, sources[0], readers(0))
    if stream.layout.unit:  # packed sequences: the documents' pieces the batch holds
        return _packed_rows(stream, index, sources, readers)
    size = stream.layout.batch_size
    first = index * size
    count = min(size, stream.length - first)
    if stream.interleave is None:
        labels = np.zeros(count, np.int64)
        before = [first]
    else:  # which source each position holds, and each source's rows before the batch
        at = stream.first + first
        labels = stream.interleave.labels(at, at + count).astype(np.int64)
        before = (stream.interleave.prefix(at) - stream.interleave.prefix(stream.first)).tolist()
    tables = []
    for rows in stream.sources:
        i = rows.source or 0
        mine = int(np.count_nonzero(labels == i))
        if not mine:
            continue
        offsets = np.arange(before[i], before[i] + mine)
        positions = _delivered(stream, rows, offsets)
        table = _read(rows, positions, sources[i], readers(i))
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
    streams: Budgeted, stream: Stream, index: int, source: PlannedSource, reader: Reads
) -> pa.Table:
    """Token-budget batch ``index`` of ``stream``: its group's rows, sorted by length and cut
    as `stream.budget.budget_batches` cuts them, from the length index (no data read)."""
    assert stream.budget is not None, "a token budget's stream counts its groups' batches"
    counts = np.asarray(stream.budget.counts)
    group, within = split_done(counts, index)
    (rows,) = stream.sources
    size = stream.layout.batch_size
    offsets = np.arange(group * size, min((group + 1) * size, rows.length))
    positions = _delivered(stream, rows, offsets)
    lengths = streams.lengths.in_order(rows.epoch_rows.order)[positions]
    order, bounds = group_batches(lengths, streams.lengths.max_tokens)
    bounds = equalised(bounds, int(counts[group]))
    return _read(rows, positions[order[bounds[within] : bounds[within + 1]]], source, reader)


def _packed_rows(
    stream: Stream,
    index: int,
    sources: Sequence[PlannedSource],
    readers: Callable[[int], Reads],
) -> pa.Table:
    """Packed batch ``index`` of ``stream`` as the pieces of documents it holds, in order: each
    piece's ``tokens`` (how many), ``position`` (its first token's position in its document),
    the document's file and row, and in a mixture its source (each sequence is one source's).
    The blocks the batch is in are read (a block's document order depends on its documents'
    lengths)."""
    first = index * stream.layout.batch_size
    stop = min(first + stream.layout.batch_size, stream.length)
    if stream.interleave is None:
        return _pieces(stream, stream.sources[0], first, stop, source=sources[0], reader=readers(0))
    at = stream.first + first
    labels = stream.interleave.labels(at, stream.first + stop)
    before = (stream.interleave.prefix(at) - stream.interleave.prefix(stream.first)).tolist()
    bounds = [0, *(np.flatnonzero(np.diff(labels)) + 1).tolist(), len(labels)]
    tables = []
    for a, b in itertools.pairwise(bounds):  # each run of one source's sequences
        i = int(labels[a])
        rows = stream.sources[i]
        end = before[i] + b - a
        table = _pieces(stream, rows, before[i], end, source=sources[i], reader=readers(i))
        tables.append(table.append_column(SOURCE_COLUMN, pa.array(np.full(len(table), i))))
        before[i] += b - a
    return pa.concat_tables(tables)


def _pieces(
    stream: Stream,
    rows: SourceRows,
    first: int,
    stop: int,
    *,
    source: PlannedSource,
    reader: Reads,
) -> pa.Table:
    """The pieces of documents of ``rows``' tokens ``[first, stop)``, counted in the order the
    stream delivers them (`_packed_rows`)."""
    layout = rows.epoch_rows.layout
    pieces: list[Fragments] = []
    at = first
    while at < stop:
        block, start, end = (
            block_of(
                at,
                rows.length,
                block_rows=layout.block_rows,
                first_block_rows=layout.first_block_rows,
            )
            if layout.shuffle
            else (0, at, stop)
        )
        parts = [rows.epoch_rows.run_pieces(run) for run in cut(rows.runs, start, end)]
        tokens = Fragments.concat(list(reader.read(parts)))
        if layout.shuffle:
            order = document_permutation(
                len(tokens.begin),
                seed=layout.seed,
                epoch=stream.iteration.epoch,
                stream=stream.topology.stream,
                block=block,
                source=rows.source,
            )
            tokens = tokens.permuted(order)
        pieces.append(tokens.slice(at - start, min(end, stop) - at))
        at = min(end, stop)
    batch = Fragments.concat(pieces)
    plan = source.plan
    chunk_rows = np.asarray(plan.chunk_rows, dtype=np.int64)
    firsts = np.cumsum(chunk_rows) - chunk_rows  # (each chunk's first document's number)
    chunks = np.searchsorted(firsts, batch.document, side="right") - 1
    in_chunk = batch.document - firsts[chunks]
    files = plan.chunks.column("file")
    first_rows = _first_rows(source)
    urls, numbers = [], []
    for chunk, kept in zip(chunks.tolist(), in_chunk.tolist(), strict=True):
        urls.append(source.fs.url(plan.chunks.paths[int(files[chunk])]))
        row = kept if source.read_options.filter is None else int(_passing(source, chunk)[kept])
        numbers.append(first_rows[chunk] + row if first_rows[chunk] >= 0 else None)
    return pa.table(
        {
            "tokens": pa.array(batch.end - batch.begin, pa.int64()),
            "position": pa.array(batch.position, pa.int64()),
            FILE_COLUMN: pa.array(urls, pa.string()),
            ROW_COLUMN: pa.array(numbers, pa.int64()),
        }
    )


def _read(
    rows: SourceRows, positions: np.ndarray, source: PlannedSource, reader: Reads
) -> pa.Table:
    """The rows at ``positions`` of ``rows``' epoch sequence (of ``source``), in that order,
    with their files and rows in them: one read of each chunk they are in."""
    plan, fs = source.plan, source.fs
    epoch_rows = rows.epoch_rows
    ends = epoch_rows.ends
    at = np.searchsorted(ends, positions, side="right")
    chunks = epoch_rows.order[at]
    wanted_rows = positions - (ends[at] - epoch_rows.rows[at])
    files = plan.chunks.column("file")
    first_rows = _first_rows(source)
    parts: list[pa.RecordBatch] = []
    taken = np.empty(len(positions), np.int64)
    urls: list[str] = [""] * len(positions)
    file_rows = np.empty(len(positions), np.int64)
    base = 0
    for chunk in np.unique(chunks).tolist():
        mine = np.flatnonzero(chunks == chunk)
        wanted = wanted_rows[mine]
        lo, hi = int(wanted.min()), int(wanted.max()) + 1
        read = list(reader.read([([Piece(chunk, lo, hi)], None)]))
        block = read[0] if len(read) == 1 else pa.concat_batches(read)
        parts.append(block)
        taken[mine] = base + (wanted - lo)
        base += block.num_rows
        url = fs.url(plan.chunks.paths[int(files[chunk])])
        for i in mine.tolist():
            urls[i] = url
        if source.read_options.filter is not None:  # rows that pass: numbered among all
            wanted = _passing(source, chunk)[wanted]
        known = first_rows[chunk] >= 0
        file_rows[mine] = first_rows[chunk] + wanted if known else -1
    joined = pa.Table.from_batches(parts).combine_chunks()
    out = pa.Table.from_batches([take(joined.to_batches()[0], taken)])
    out = out.append_column(FILE_COLUMN, pa.array(urls, pa.string()))
    numbers = pa.array(file_rows, pa.int64(), mask=file_rows < 0)  # (null: not known)
    return out.append_column(ROW_COLUMN, numbers)


def _passing(source: PlannedSource, index: int) -> np.ndarray:
    """The rows of chunk ``index`` of ``source`` that pass its row filter, numbered among the
    chunk's rows."""
    chunk = source.plan.chunks[index]
    options = source.read_options
    out, base = [], 0
    for read in source.format.read(chunk, 0, chunk.num_rows, source.fs, options):
        batch = with_partition(read, chunk.partition, options)
        numbers = pa.array(np.arange(base, base + batch.num_rows, dtype=np.int64))
        kept = batch.append_column("__number__", numbers).filter(options.filter)
        out.append(kept.column("__number__").to_numpy())
        base += batch.num_rows
    return np.concatenate(out) if out else np.zeros(0, np.int64)


def _first_rows(source: PlannedSource) -> np.ndarray:
    """Each chunk's first row in its file (-1: not known). A file's chunks are consecutive in
    the plan, in file order: a chunk's first row is the rows of the chunks before it, where
    they start at the file's first unit and leave none out; else (units pruned by a filter)
    a Parquet footer's row groups tell it."""
    chunks = source.plan.chunks
    files, rows = chunks.column("file"), chunks.num_rows
    starts, stops = chunks.column("start"), chunks.column("stop")
    before = np.cumsum(rows) - rows
    opens = np.ones(len(files), bool)
    opens[1:] = files[1:] != files[:-1]
    first = np.maximum.accumulate(np.where(opens, np.arange(len(files)), 0))
    out: np.ndarray = before - before[first]
    # Where the plan left units out (a gap, or a file's first chunk past its first unit).
    gaps = np.flatnonzero(opens & (starts != 0))
    joins = np.flatnonzero(~opens[1:] & (starts[1:] != stops[:-1])) + 1
    for file in np.unique(files[np.r_[gaps, joins].astype(np.int64)]).tolist():
        mine = np.flatnonzero(files == file)
        out[mine] = _footer_rows(source, chunks.paths[file], starts[mine])
    return out


def _footer_rows(source: PlannedSource, path: str, units: np.ndarray) -> np.ndarray:
    """The first rows of row groups ``units`` of a Parquet file (-1: not a Parquet file)."""
    if source.format.name != "parquet":
        return np.full(len(units), -1, np.int64)
    import pyarrow.parquet as pq

    with source.fs.open_input(path) as handle:
        meta = pq.ParquetFile(handle).metadata
        sizes = [meta.row_group(i).num_rows for i in range(meta.num_row_groups)]
    ends = np.cumsum([0, *sizes])
    found: np.ndarray = ends[units]
    return found
