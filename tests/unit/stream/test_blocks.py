"""``shuffled_blocks`` + ``cut_batches``: a stream's rows become shuffled, equal-size batches."""

from __future__ import annotations

import functools
import itertools
from collections.abc import Iterator

import numpy as np
import pyarrow as pa
import pytest

from tests.conftest import make_table
from torch_dataloader_utils.convert.arrow_values import take
from torch_dataloader_utils.planning import Layout, block_start
from torch_dataloader_utils.stream.batches import cut_batches
from torch_dataloader_utils.stream.blocks import Segment, block_sizes, shuffled_blocks


def split(table: pa.Table, pieces: int) -> list[pa.RecordBatch]:
    """The table's rows as ``pieces`` record batches of uneven sizes (some may be empty)."""
    rb = table.combine_chunks().to_batches()[0] if table.num_rows else None
    if rb is None:
        return []
    rng = np.random.default_rng(pieces)
    cuts = np.sort(rng.integers(0, table.num_rows + 1, size=pieces - 1))
    bounds = [0, *cuts.tolist(), table.num_rows]
    return [rb.slice(a, b - a) for a, b in itertools.pairwise(bounds)]


def run(
    table: pa.Table,
    options: Layout,
    *,
    pieces: int = 7,
    epoch: int = 0,
    stream: int = 0,
    parts: int = 1,
) -> list[pa.RecordBatch]:
    blocks = shuffled_blocks(
        iter(split(table, pieces)),
        table.num_rows,
        options,
        epoch=epoch,
        stream=stream,
        parts=parts,
    )
    return materialize(cut_batches(blocks, options.batch_size))


def materialize(segments: Iterator[Segment]) -> list[pa.RecordBatch]:
    """Each ``(batch, rows)`` segment as the record batch of those rows in that order (a
    block left in parts, a table, taken from its parts)."""
    out = []
    for batch, rows in segments:
        if isinstance(batch, pa.Table):
            assert rows is not None, "only shuffled blocks are left in parts"
            assert 1 < batch.column(0).num_chunks <= 8
            got = take(batch, rows)
            assert got.equals(batch.combine_chunks().to_batches()[0].take(pa.array(rows)))
        else:
            assert isinstance(batch, pa.RecordBatch)
            got = batch if rows is None else batch.take(pa.array(rows))
        out.append(got)
    return out


def ids_of(batches: list[pa.RecordBatch]) -> list[int]:
    return [i for b in batches for i in b.column("id").to_pylist()]


def options(**kw: object) -> Layout:
    base: dict[str, object] = {
        "batch_size": 32,
        "shuffle": True,
        "block_rows": 100,
        "first_block_rows": 100,
        "seed": 11,
        "drop_last": False,
        "remainder": "drop",
    }
    base.update(kw)
    return Layout(**base)  # type: ignore[arg-type]


TABLE = make_table(np.arange(1000, 1537))  # 537 rows: not a multiple of batch or block sizes


def check_sizes(batches: list[pa.RecordBatch], total: int, batch_size: int) -> None:
    sizes = [b.num_rows for b in batches]
    assert sum(sizes) == total
    assert all(s == batch_size for s in sizes[:-1]), sizes
    if sizes:
        assert 0 < sizes[-1] <= batch_size, sizes


@pytest.mark.parametrize("shuffle", [True, False])
@pytest.mark.parametrize("batch_size", [1, 7, 32, 100, 537, 1000])
def test_rows_preserved_and_only_the_last_batch_short(shuffle: bool, batch_size: int) -> None:
    opts = options(shuffle=shuffle, batch_size=batch_size, first_block_rows=13)
    batches = run(TABLE, opts)
    check_sizes(batches, TABLE.num_rows, batch_size)
    assert sorted(ids_of(batches)) == TABLE.column("id").to_pylist()
    # Whole rows move together: every column still agrees with the id.
    got = pa.Table.from_batches(batches)
    by_id = make_table(np.array(got.column("id").to_pylist()))
    assert got.equals(by_id)


def test_no_shuffle_keeps_order() -> None:
    for pieces in [1, 7, 100]:
        batches = run(TABLE, options(shuffle=False), pieces=pieces)
        assert pa.Table.from_batches(batches).equals(TABLE.combine_chunks())


def test_shuffle_changes_the_order_within_blocks() -> None:
    block = 100
    batches = run(TABLE, options(block_rows=block, first_block_rows=block, batch_size=50))
    got = ids_of(batches)
    original = TABLE.column("id").to_pylist()
    assert got != original
    # Rows are shuffled inside their block only: each block of output holds exactly the rows of
    # the same block of input.
    for start in range(0, len(original), block):
        assert sorted(got[start : start + block]) == original[start : start + block]
    # And each block is really permuted, not left in order.
    assert all(
        got[start : start + block] != original[start : start + block]
        for start in range(0, len(original) - block, block)
    )


def test_deterministic_for_the_same_seed_epoch_and_stream() -> None:
    reference = ids_of(run(TABLE, options()))
    assert ids_of(run(TABLE, options())) == reference
    # Each of seed, epoch and stream changes the order.
    assert ids_of(run(TABLE, options(seed=12))) != reference
    assert ids_of(run(TABLE, options(), epoch=1)) != reference
    assert ids_of(run(TABLE, options(), stream=1)) != reference
    assert ids_of(run(TABLE, options(), epoch=1)) == ids_of(run(TABLE, options(), epoch=1))


@pytest.mark.parametrize(
    "opts",
    [
        options(),
        options(first_block_rows=5, block_rows=64, batch_size=10),
        options(shuffle=False, batch_size=10),
    ],
    ids=["shuffle", "ramp", "no-shuffle"],
)
def test_result_does_not_depend_on_how_the_input_was_split(opts: Layout) -> None:
    outputs = [
        run(TABLE, opts, pieces=pieces, epoch=2, stream=3, parts=parts)
        for pieces in (1, 7, 100)
        for parts in (1, 8)  # blocks joined, or left in up to 8 parts
    ]
    for other in outputs[1:]:
        assert [b.num_rows for b in other] == [b.num_rows for b in outputs[0]]
        assert all(a.equals(b) for a, b in zip(outputs[0], other, strict=True))


@pytest.mark.parametrize("shuffle", [True, False])
@pytest.mark.parametrize("start", [0, 1, 12, 13, 99, 100, 101, 300, 536, 537])
@pytest.mark.parametrize("parts", [1, 8])
def test_starting_inside_a_block_continues_the_same_order(
    shuffle: bool, start: int, parts: int
) -> None:
    """A resumed stream re-reads the block that holds ``start`` and skips what was delivered."""
    opts = options(shuffle=shuffle, first_block_rows=13, batch_size=1)
    full = ids_of(run(TABLE, opts))
    _, first = block_start(TABLE.num_rows, start, opts)
    rest = TABLE.slice(first)
    blocks = shuffled_blocks(
        iter(split(rest, 5)), TABLE.num_rows, opts, epoch=0, stream=0, start=start, parts=parts
    )
    assert ids_of(materialize(cut_batches(blocks, 1))) == full[start:]


def test_empty_stream_gives_no_batches() -> None:
    empty = TABLE.slice(0, 0)
    for shuffle in [True, False]:
        assert run(empty, options(shuffle=shuffle), pieces=1) == []


# --- cut_batches alone ------------------------------------------------------------------------


def blocks(sizes: list[int], *, permuted: bool = False) -> Iterator[Segment]:
    """Consecutive segments of ``sizes`` rows, ids running on from 0.

    With ``permuted``, each segment is a reversed block with the permutation that restores it.
    """
    start = 0
    for size in sizes:
        table = make_table(np.arange(start, start + size))
        batch = pa.RecordBatch.from_arrays(
            [c.combine_chunks() for c in table.columns], schema=table.schema
        )
        if permuted:
            yield batch.take(pa.array(np.arange(size)[::-1])), np.arange(size)[::-1].copy()
        else:
            yield batch, None
        start += size


@pytest.mark.parametrize(
    "sizes", [[], [0], [5], [3, 0, 4, 9, 1, 0, 20], [64, 64], [100, 1, 1, 1, 37]]
)
@pytest.mark.parametrize("batch_size", [1, 4, 10, 64])
@pytest.mark.parametrize("permuted", [False, True])
def test_cut_batches_concatenates_and_cuts_exactly(
    sizes: list[int], batch_size: int, permuted: bool
) -> None:
    batches = materialize(cut_batches(blocks(sizes, permuted=permuted), batch_size))
    check_sizes(batches, sum(sizes), batch_size)
    assert ids_of(batches) == list(range(sum(sizes)))
    if batches:
        assert pa.Table.from_batches(batches).equals(make_table(np.arange(sum(sizes))))


# --- block sizes --------------------------------------------------------------------------------


def test_first_block_spans_few_chunks_of_tiny_files() -> None:
    sizes = functools.partial(block_sizes, block_size=None, block_bytes=64 << 20, row_bytes=20.0)
    # Large chunks: the first block is 65,536 rows (whole batches), whatever the chunks.
    assert (
        sizes(batch_size=1000) == sizes(batch_size=1000, chunk_rows=100_000) == (3_355_000, 65_000)
    )
    # Chunks of 50 rows: 64 of them, in whole batches.
    assert sizes(batch_size=1000, chunk_rows=50.0) == (3_355_000, 3_000)
    assert sizes(batch_size=32, chunk_rows=50.0) == (3_355_424, 3_200)
    # At least one batch.
    assert sizes(batch_size=4096, chunk_rows=1.0) == (3_354_624, 4096)
    # Rows by count: the first block is never larger than a block.
    assert block_sizes(
        batch_size=10, block_size=100, block_bytes=0, row_bytes=1.0, chunk_rows=50.0
    ) == (100, 100)


def test_a_block_that_could_overflow_when_joined_is_joined_at_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The converter joins some columns of a block left in parts; a block whose columns could
    overflow 32-bit offsets is joined where the overflow becomes a clear error (the pipeline)."""
    from torch_dataloader_utils.stream import blocks

    opts = options()
    kinds = {
        type(b)
        for b, _ in shuffled_blocks(
            iter(split(TABLE, 20)), TABLE.num_rows, opts, epoch=0, stream=0, parts=8
        )
    }
    assert pa.Table in kinds  # small blocks of a few batches stay in parts
    monkeypatch.setattr(blocks, "JOINABLE_BYTES", 1)
    joined = [
        b
        for b, _ in shuffled_blocks(
            iter(split(TABLE, 20)), TABLE.num_rows, opts, epoch=0, stream=0, parts=8
        )
    ]
    assert all(isinstance(b, pa.RecordBatch) for b in joined)
    assert sorted(ids_of(joined)) == TABLE.column("id").to_pylist()
