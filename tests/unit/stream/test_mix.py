"""``interleaved``: a mixture's batches, gathered from a window over the sources' current blocks
(or, for a batch that spans two blocks of a source, taken and joined), hold at each position the
next row of the source the interleave gives it, exactly as a row-by-row reference says.

The sources are real Parquet files with strings, lists and nulls; one stores its ids as int32
(cast to the mixture's int64); blocks are small, so that batches span blocks. Read without the
list column (`FLAT`), every block is permuted whole as it comes (`stream.blocks.permuted`) and
batches gather runs of consecutive rows from the joined blocks; with it, rows are gathered by
the blocks' permutations."""

from __future__ import annotations

import itertools
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from torch_dataloader_utils.convert.arrow_values import take
from torch_dataloader_utils.errors import DataError
from torch_dataloader_utils.planning import Layout
from torch_dataloader_utils.planning.interleave import Interleave, Mixing
from torch_dataloader_utils.stream import mix
from torch_dataloader_utils.stream.blocks import Segment, shuffled_blocks
from torch_dataloader_utils.stream.mix import interleaved

ROWS = (900, 500, 300)
SCHEMA = pa.schema(
    [("id", pa.int64()), ("s", pa.string()), ("l", pa.list_(pa.int64())), ("x", pa.float64())]
)
FLAT = pa.schema([SCHEMA.field("id"), SCHEMA.field("s"), SCHEMA.field("x")])  # permuted whole


@pytest.fixture(scope="module")
def sources(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    """One Parquet file a source: ids ``[1000 k, 1000 k + rows)``, strings, lists and floats
    with nulls; source 2's ids stored as int32."""
    root = tmp_path_factory.mktemp("mix")
    paths = []
    for k, rows in enumerate(ROWS):
        ids = np.arange(1000 * k, 1000 * k + rows)
        table = pa.table(
            {
                "id": pa.array(ids, pa.int32() if k == 2 else pa.int64()),
                "s": [None if i % 7 == 0 else f"r{i}" * (i % 4) for i in ids.tolist()],
                "l": pa.array(
                    [None if i % 11 == 0 else list(range(i % 6)) for i in ids.tolist()],
                    pa.list_(pa.int64()),
                ),
                "x": pa.array(ids * 0.5, mask=ids % 13 == 0),
            }
        )
        paths.append(root / f"s{k}.parquet")
        pq.write_table(table, paths[-1], row_group_size=70)
    return paths


def blocks(path: Path, k: int, *, block_rows: int, shuffle: bool) -> list[Segment]:
    """Source ``k``'s shuffled blocks, from its file's row groups as read."""
    layout = Layout(16, shuffle, 3, False, "uneven", block_rows, block_rows // 2)
    batches = pq.ParquetFile(path).iter_batches(batch_size=70)
    length = pq.ParquetFile(path).metadata.num_rows
    return list(shuffled_blocks(batches, length, layout, epoch=1, stream=0, source=k))


def reference(
    segments: list[list[Segment]],
    labels: np.ndarray,
    source_column: str | None,
    schema: pa.Schema = SCHEMA,
) -> pa.Table:
    """Position ``p`` holds the next row of source ``labels[p]``, its blocks' rows in order."""
    ordered = []
    for k, segs in enumerate(segments):
        rows = pa.Table.from_batches([take(b, r) for b, r in segs])
        rows = rows.select(schema.names).cast(schema)
        if source_column is not None:
            rows = rows.append_column(source_column, pa.array(np.full(rows.num_rows, k)))
        ordered.append(rows.combine_chunks())
    table = pa.concat_tables(ordered).combine_chunks()
    starts = np.cumsum([0] + [t.num_rows for t in ordered[:-1]])
    rank = np.empty(len(labels), np.int64)  # each position's row among its source's
    for k in range(len(ordered)):
        mine = labels == k
        rank[mine] = np.arange(int(mine.sum()))
    return table.take(pa.array(starts[labels] + rank))


@pytest.mark.parametrize("mixing", ["random", "stratified"])
@pytest.mark.parametrize(
    ("batch_size", "block_rows", "first"),
    [(1, 64, 0), (7, 64, 5), (32, 128, 0), (100, 96, 33), (1024, 256, 0), (5000, 64, 0)],
)
@pytest.mark.parametrize("source_column", [None, "source"])
@pytest.mark.parametrize("shuffle", [True, False])
@pytest.mark.parametrize("schema", [SCHEMA, FLAT], ids=["lists", "flat"])
def test_rows_match_row_by_row(
    sources: list[Path],
    mixing: Mixing,
    batch_size: int,
    block_rows: int,
    first: int,
    source_column: str | None,
    shuffle: bool,
    schema: pa.Schema,
) -> None:
    out = check(sources, mixing, batch_size, block_rows, first, source_column, shuffle, schema)
    if shuffle and batch_size < block_rows:  # most batches gathered from a joined window
        assert max(b.num_rows for b, _ in out) > batch_size


@pytest.mark.parametrize("mixing", ["random", "stratified"])
@pytest.mark.parametrize("schema", [SCHEMA, FLAT], ids=["lists", "flat"])
def test_blocks_too_large_to_join_are_taken(
    sources: list[Path], mixing: Mixing, schema: pa.Schema, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Blocks whose join could overflow 32-bit offsets: every batch taken and joined."""
    monkeypatch.setattr(mix, "JOINABLE_BYTES", 1)
    out = check(sources, mixing, 32, 128, 0, "source", True, schema)
    assert max(b.num_rows for b, _ in out) == 32


def check(
    sources: list[Path],
    mixing: Mixing,
    batch_size: int,
    block_rows: int,
    first: int,
    source_column: str | None,
    shuffle: bool,
    schema: pa.Schema = SCHEMA,
) -> list[Segment]:
    """`interleaved`'s batches of positions ``[first, 1400)``, checked against `reference`."""
    counts = (800, 480, 320)  # more than some sources hold: nothing past the sources' rows read
    interleave = Interleave(counts, mixing, seed=3, epoch=1)
    end = 1400
    labels = interleave.labels(first, end)
    have = np.bincount(labels, minlength=3)
    segments = []
    for k, path in enumerate(sources):
        segs = blocks(path, k, block_rows=block_rows, shuffle=shuffle)
        # Only the rows these positions take: as a stream's source rows are.
        segments.append(cut_to(segs, int(have[k])))
    out = list(
        interleaved(
            [iter(s) for s in segments],
            interleave,
            (first, end),
            batch_size,
            schema,
            where=[lambda: "here"] * 3,
            source_column=source_column,
        )
    )
    sizes = [len(rows) for _, rows in out]
    assert sizes == [min(batch_size, end - a) for a in range(first, end, batch_size)]
    got = pa.Table.from_batches([take(b, rows) for b, rows in out])
    want = reference(segments, labels, source_column, schema)
    assert got.schema == want.schema
    assert got.equals(want)
    ids = got.column("id").to_pylist()
    expected = sorted(i for k in range(3) for i in want.column("id").to_pylist() if i // 1000 == k)
    assert sorted(ids) == expected  # (the multiset of ids)
    return out


def cut_to(segments: list[Segment], rows: int) -> list[Segment]:
    """The first ``rows`` rows of ``segments`` (the last one cut)."""
    out: list[Segment] = []
    for batch, order in segments:
        length = batch.num_rows if order is None else len(order)
        if rows <= 0:
            break
        if length <= rows:
            out.append((batch, order))
        elif order is None:
            out.append((batch.slice(0, rows), None))
        else:
            out.append((batch, order[:rows]))
        rows -= length
    return out


def test_rows_ending_early_are_named(sources: list[Path]) -> None:
    interleave = Interleave((600, 400), "random", seed=1, epoch=0)
    short = [blocks(p, k, block_rows=64, shuffle=True) for k, p in enumerate(sources[:2])]
    short[1] = short[1][:2]  # fewer rows than the positions give source 1
    batches = interleaved(
        [iter(s) for s in short],
        interleave,
        (0, 1000),
        50,
        SCHEMA,
        where=[lambda: "a.parquet", lambda: "b.parquet"],
    )
    with pytest.raises(DataError, match=r"b\.parquet: the source's rows ended"):
        list(itertools.islice(batches, 100))


@pytest.mark.parametrize("mixing", ["random", "stratified"])
@pytest.mark.parametrize("schema", [SCHEMA, FLAT], ids=["lists", "flat"])
def test_blocks_ending_together_are_joined_once(
    sources: list[Path], mixing: Mixing, schema: pa.Schema
) -> None:
    """Blocks sized by the sources' shares of the positions (as a mixture's are) end about
    together: each source nearly used up then has its next block joined with the others' (one
    join a round of blocks, not one a source), and the rows are still the reference's."""
    counts, end, batch_size = (800, 480, 320), 1600, 8
    interleave = Interleave(counts, mixing, seed=5, epoch=0)
    labels = interleave.labels(0, end)
    have = np.bincount(labels, minlength=3)
    segments = []
    for k, path in enumerate(sources):
        rows = counts[k] // 4  # 4 rounds of blocks in all: each a quarter of the positions
        layout = Layout(16, True, 3, False, "uneven", rows, rows)
        batches = list(pq.ParquetFile(path).iter_batches(batch_size=70))
        read = itertools.chain.from_iterable([batches] * 2)  # (sources 1-2 repeat their rows)
        segs = list(shuffled_blocks(read, int(have[k]), layout, epoch=0, stream=0, source=k))
        segments.append(cut_to(segs, int(have[k])))
    joins: list[int] = []
    real = mix._Joined._join

    def counted(self: mix._Joined, wanted: dict[int, int]) -> bool:
        joins.append(len(wanted))
        return real(self, wanted)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(mix._Joined, "_join", counted)
        out = list(
            interleaved(
                [iter(s) for s in segments],
                interleave,
                (0, end),
                batch_size,
                schema,
                where=[lambda: "here"] * 3,
            )
        )
    assert len(joins) <= 4  # (one a source and round would be 12)
    got = pa.Table.from_batches([take(b, rows) for b, rows in out])
    want = reference(segments, labels, None, schema)
    assert got.equals(want)
    assert sorted(got.column("id").to_pylist()) == sorted(want.column("id").to_pylist())
