"""Shuffle blocks permuted whole (`stream.blocks.permuted_whole`): the same batches, in the
same order, as gathering each batch from the block; and the block's source let go."""

from __future__ import annotations

import gc
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest

import torch_dataloader_utils as tdu
from tests.conftest import make_table
from tests.unit.stream.test_blocks import ids_of, materialize, options, split
from torch_dataloader_utils.stream.batches import cut_batches
from torch_dataloader_utils.stream.blocks import permuted_whole, shuffled_blocks
from torch_dataloader_utils.stream.prefetch import Prefetcher

pytestmark = [
    pytest.mark.timeout(120),
    pytest.mark.filterwarnings("ignore:This DataLoader will create:UserWarning"),
]

FULL = make_table(np.arange(5000, 5537))
FLAT = FULL.drop_columns(["tokens"])  # a list column's block is gathered batch by batch


def blocks(
    table: pa.Table, *, parts: int, start: int = 0, whole: bool = False, **layout: Any
) -> Any:
    opts = options(**layout)
    return shuffled_blocks(
        iter(split(table, 23)),
        table.num_rows,
        opts,
        epoch=3,
        stream=1,
        start=start,
        parts=parts,
        whole=whole,
    )


@pytest.mark.parametrize(("parts", "in_parts"), [(1, False), (8, False), (1, True)])
@pytest.mark.parametrize("start", [0, 70, 301])
@pytest.mark.parametrize("batch_size", [1, 32, 100])
def test_the_batches_are_those_gathered_from_the_block(
    parts: int, in_parts: bool, start: int, batch_size: int
) -> None:
    """Batch for batch, the rows of the block's permutation (a resumed stream's, from
    ``start``), whether the block is one record batch or left in parts (any number of them,
    ``in_parts``)."""
    gathered = materialize(cut_batches(blocks(FLAT, parts=parts, start=start), batch_size))
    whole = list(
        cut_batches(
            permuted_whole(blocks(FLAT, parts=parts, start=start, whole=in_parts)), batch_size
        )
    )
    assert all(rows is None and isinstance(b, pa.RecordBatch) for b, rows in whole)
    assert len(whole) == len(gathered)
    for (got, _), want in zip(whole, gathered, strict=True):
        assert got.equals(want)
    ids = ids_of(gathered)
    assert len(ids) == len(set(ids)) == FLAT.num_rows - start
    assert ids != sorted(ids)  # shuffled


def test_a_flat_block_to_be_permuted_whole_is_not_joined_first() -> None:
    """With ``whole``, a block of flat columns read as more batches than ``parts`` stays a
    table over them (the permutation is its one copy); a block with a list column is joined
    into one batch as before, to be gathered from."""
    flat = list(blocks(FLAT, parts=1, whole=True, block_rows=200, first_block_rows=200))
    read = {b.column("id").buffers()[1].address for b in split(FLAT, 23) if b.num_rows}
    chunked = [b for b, _ in flat if isinstance(b, pa.Table)]
    assert chunked, "every block of flat columns spans several read batches here"
    for block in chunked:  # its chunks are the read batches' own memory
        for chunk in block.column("id").chunks:
            assert chunk.buffers()[1].address in read
    listed = list(blocks(FULL, parts=1, whole=True, block_rows=200, first_block_rows=200))
    assert all(isinstance(b, pa.RecordBatch) for b, _ in listed)
    ids = ids_of([b for b, _ in cut_batches(permuted_whole(iter(flat)), 32)])
    assert sorted(ids) == FLAT.column("id").to_pylist()


def test_a_block_with_a_list_column_is_gathered_batch_by_batch() -> None:
    """A list column's take copies row by row: such a block passes as it is."""
    segments = list(permuted_whole(blocks(FULL, parts=8)))
    assert all(rows is not None for _, rows in segments)
    got = materialize(cut_batches(iter(segments), 32))
    assert sorted(ids_of(got)) == FULL.column("id").to_pylist()


def test_unshuffled_batches_pass_as_they_are() -> None:
    segments = list(permuted_whole(blocks(FLAT, parts=8, shuffle=False)))
    assert [b.num_rows for b, _ in segments] == [b.num_rows for b in split(FLAT, 23)]
    assert ids_of([b for b, _ in segments]) == FLAT.column("id").to_pylist()


def test_a_block_permuted_whole_is_held_about_once() -> None:
    """Nothing between the read and the permutation keeps the block's source: while one
    block is consumed, the pool holds it permuted and little of its source (read ahead in a
    thread, as the pipeline does)."""
    rows, block_rows = 400_000, 100_000

    def fresh() -> Any:  # each batch in the pool, owned by the pipeline alone
        for start in range(0, rows, 25_000):
            ids = pc.add(pa.array(np.arange(start, start + 25_000)), 0)
            yield pa.record_batch({"id": ids, "x": pc.multiply(ids, 2)})

    gc.collect()
    base = pa.total_allocated_bytes()
    opts = options(batch_size=1024, block_rows=block_rows, first_block_rows=block_rows)
    ahead = Prefetcher(
        shuffled_blocks(fresh(), rows, opts, epoch=0, stream=0, parts=8), depth=1, name="t"
    )
    block_bytes = block_rows * 16
    held = []
    seen: list[int] = []
    try:
        for batch, order in permuted_whole(ahead):
            assert order is None
            seen.extend(batch.column("id").to_pylist())
            gc.collect()
            # The block permuted and the next one being read: not the source as well.
            held.append(pa.total_allocated_bytes() - base)
            del batch
    finally:
        ahead.close()
    assert sorted(seen) == list(range(rows))
    assert max(held) <= 2.25 * block_bytes, [h / block_bytes for h in held]


def _ids(loader: tdu.TabularDataLoader) -> list[list[int]]:
    return [batch["id"].tolist() for batch in loader]


@pytest.mark.parametrize("workers", [0, 2])
def test_a_loaders_order_does_not_depend_on_the_blocks_column_types(
    parquet_dir: Any, workers: int
) -> None:
    """Read without the list column (blocks permuted whole) and with it (gathered batch by
    batch), the loader gives the same batches, every row once, two epochs and a resume."""
    root, total = parquet_dir((1200, 777, 1500), row_group_size=100)

    def loader(columns: list[str] | None) -> tdu.TabularDataLoader:
        return tdu.create_dataloader(
            root,
            format="parquet",
            batch_size=128,
            shuffle=True,
            shuffle_seed=5,
            shuffle_block_size=1024,
            columns=columns,
            num_workers=workers,
            multiprocessing_context="fork",
            timeout=60,
        )

    flat_columns = [n for n in FULL.column_names if n != "tokens"]
    for epoch in (0, 1):
        gathered, whole = loader(None), loader(flat_columns)
        gathered.set_epoch(epoch)
        whole.set_epoch(epoch)
        want, got = _ids(gathered), _ids(whole)
        assert got == want
        ids = [i for b in got for i in b]
        assert sorted(ids) == list(range(total))
        assert ids != sorted(ids)

    # Resumed inside a block: the rest of the same order.
    saver = loader(flat_columns)
    saver.set_epoch(1)
    it = iter(saver)
    head = [next(it)["id"].tolist() for _ in range(5)]
    state = saver.state_dict()
    del it
    resumer = loader(flat_columns)
    resumer.load_state_dict(state)
    rest = _ids(resumer)
    assert head + rest == want


@pytest.mark.parametrize("batch_size", [32, 256])
@pytest.mark.parametrize("mixing", ["random", "stratified"])
def test_a_mixtures_order_does_not_depend_on_its_blocks_column_types(
    parquet_dir: Any, mixing: str, batch_size: int
) -> None:
    """A mixture's sources' blocks of flat columns are permuted whole as they are loaded
    (`stream.mix`): the same batches as gathering them, every row once."""
    roots = [parquet_dir(sizes, name=f"s{i}")[0] for i, sizes in enumerate([(900, 400), (500,)])]
    want: list[list[int]] | None = None
    for columns in (None, [n for n in FULL.column_names if n != "tokens"]):
        loader = tdu.create_dataloader(
            [tdu.Source(roots[0], weight=1300), tdu.Source(roots[1], weight=500)],
            format="parquet",
            mixing=mixing,
            batch_size=batch_size,
            shuffle=True,
            shuffle_block_size=512,
            columns=columns,
            source_column="source",
        )
        loader.set_epoch(2)
        got = [list(zip(b["source"].tolist(), b["id"].tolist(), strict=True)) for b in loader]
        rows = [r for b in got for r in b]  # weights by size: every row once
        assert sorted(rows) == [(0, i) for i in range(1300)] + [(1, i) for i in range(500)]
        assert rows != sorted(rows)
        if want is None:
            want = got
        assert got == want


def test_flat_values_match_the_file(tmp_path: Path) -> None:
    """Every column of a row permuted whole holds that row's values (id-keyed)."""
    from tests.conftest import write_parquet

    write_parquet(tmp_path / "a.parquet", np.arange(3000), row_group_size=250)
    loader = tdu.create_dataloader(
        tmp_path,
        format="parquet",
        batch_size=256,
        shuffle=True,
        columns=["id", "x", "label", "flag", "name", "emb"],
        output_format="numpy",
    )
    seen = []
    for batch in loader:
        want = make_table(batch["id"])
        assert np.array_equal(batch["x"], want.column("x").to_numpy())
        assert np.array_equal(batch["label"], want.column("label").to_numpy())
        assert np.array_equal(batch["flag"], want.column("flag").to_numpy(zero_copy_only=False))
        assert list(batch["name"]) == want.column("name").to_pylist()
        emb = np.asarray(want.column("emb").combine_chunks().flatten()).reshape(-1, 4)
        assert np.array_equal(batch["emb"], emb)
        seen.extend(batch["id"].tolist())
    assert sorted(seen) == list(range(3000))
