"""`formats.parquet.row_groups`: rows per decoded batch, and a stream's first block decoded in
batches of its own size (`Format.quick_start`), with the same rows in the same order."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

import torch_dataloader_utils as tdu
from tests.conftest import QuickBatches
from torch_dataloader_utils.formats import Listing, ReadOptions
from torch_dataloader_utils.formats.parquet import ParquetFormat, row_groups
from torch_dataloader_utils.fs import FileSystemSpec, list_files

ROWS, ROW_GROUP, TOKENS = 6_000, 3_000, 600


def _wide(root: Path, files: int = 2) -> Path:
    """``files`` files of token lists of ~2.4 KB a row: a decoded batch is ~3,400 rows."""
    root.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    for f in range(files):
        ids = np.arange(f * ROWS, (f + 1) * ROWS)
        lengths = rng.integers(TOKENS // 2, TOKENS * 3 // 2, ROWS)
        offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
        values = rng.integers(0, 50_000, int(offsets[-1]), dtype=np.int32)
        tokens = pa.ListArray.from_arrays(pa.array(offsets), pa.array(values))
        table = pa.table({"id": pa.array(ids), "tokens": tokens})
        pq.write_table(table, root / f"part-{f}.parquet", row_group_size=ROW_GROUP)
    return root


def test_quick_rows_only_for_a_first_block_smaller_than_a_batch() -> None:
    assert row_groups.quick_rows(3_400, 0, 0, 3_000) == 3_400  # not wanted soon
    assert row_groups.quick_rows(3_400, 256, 0, 3_000) == 256
    assert row_groups.quick_rows(3_400, 4_096, 0, 3_000) == 3_400  # a batch holds the block
    blocks = row_groups.QUICK_BLOCKS
    assert row_groups.quick_rows(3_400, 256, 0, blocks * 256) == 256
    assert row_groups.quick_rows(3_400, 256, 0, blocks * 256 + 1) == 3_400  # its parts: copied


def test_rows_per_batch_from_the_footer(tmp_path: Path) -> None:
    path = _wide(tmp_path / "wide", files=1) / "part-0.parquet"
    metadata = pq.ParquetFile(path).metadata
    rows = row_groups.batch_rows(metadata, 0, None)
    assert 1_000 < rows < 16_384  # ~8 MiB of the footer's uncompressed bytes
    assert row_groups.batch_rows(metadata, 0, ["id"]) == 16_384  # narrow: the most rows
    narrow = tmp_path / "narrow.parquet"
    pq.write_table(pa.table({"id": np.arange(100)}), narrow)
    assert row_groups.batch_rows(pq.ParquetFile(narrow).metadata, 0, None) == 16_384


def _first_read(fmt: ParquetFormat, root: Path) -> tuple[list[list[int]], list[int]]:
    """Each read's batch sizes, of two reads of the first chunk; and the ids read."""
    fs = FileSystemSpec.for_path(str(root))
    planned = fmt.plan(Listing.of(list_files(str(root), fs)), fs, ReadOptions(split_rows=ROWS))
    chunk, options = planned.chunks[0], planned.read_options or ReadOptions()
    sizes: list[list[int]] = []
    ids: list[int] = []
    for _ in range(2):
        batches = list(fmt.read(chunk, 0, chunk.num_rows, fs, options))
        sizes.append([b.num_rows for b in batches])
        ids += [i for b in batches for i in b.column("id").to_pylist()]
        fmt.close()  # (a stream's end)
    return sizes, ids


def test_a_quick_start_decodes_the_first_row_group_in_the_blocks_size(tmp_path: Path) -> None:
    root = _wide(tmp_path / "wide", files=1)
    fmt = ParquetFormat()
    fmt.quick_start(256)
    (quick, after), ids = _first_read(fmt, root)
    # The first row group in batches of 256 rows; the second, and the next read, as before.
    assert quick[: -(-ROW_GROUP // 256)] == [256] * (ROW_GROUP // 256) + [ROW_GROUP % 256]
    assert max(quick[-(-ROW_GROUP // 256) :]) > 256
    assert min(after[:-1]) > 256
    assert ids == list(range(ROWS)) * 2


def test_close_forgets_a_quick_start(tmp_path: Path) -> None:
    root = _wide(tmp_path / "wide", files=1)
    fmt = ParquetFormat()
    fmt.quick_start(256)
    fmt.close()
    (first, _), _ = _first_read(fmt, root)
    assert min(first[:-1]) > 256


def _order(root: Path, workers: int) -> list[int]:
    loader = tdu.create_dataloader(
        str(root),
        batch_size=64,
        shuffle=True,
        shuffle_seed=3,
        shuffle_block_size=256,
        num_workers=workers,
        multiprocessing_context="fork" if workers else None,
    )
    order: list[int] = []
    for epoch in (0, 1):
        loader.set_epoch(epoch)
        epoch_ids = [i for batch in loader for i in batch["id"].tolist()]
        assert Counter(epoch_ids) == Counter(range(2 * ROWS))
        order += epoch_ids
    return order


@pytest.mark.parametrize("workers", [0, 2])
def test_the_loader_reads_the_same_order_with_a_quick_first_block(
    tmp_path: Path, quick_batches: QuickBatches, workers: int
) -> None:
    """Blocks sit at fixed stream positions: smaller decoded batches change no row's place.
    The quick batches are taken (a fork worker's are counted in its own process, so in-process
    only)."""
    root = _wide(tmp_path / "wide")
    quick = _order(root, workers)
    assert workers or any(quick_batches.taken)
    quick_batches.never()
    assert quick == _order(root, workers)
    assert not any(quick_batches.taken)


def test_chunks_read_whole_keep_their_batches(tmp_path: Path, quick_batches: QuickBatches) -> None:
    """A filtered (or transformed) stream reads each chunk whole and counts its rows after the
    filter, as planning did: its batches stay the ones planning read (no quick batches)."""
    root = _wide(tmp_path / "wide")
    loader = tdu.create_dataloader(
        str(root),
        batch_size=64,
        shuffle=True,
        shuffle_block_size=256,
        filters=pc.field("id") >= 100,
        num_workers=0,
    )
    ids = [i for batch in loader for i in batch["id"].tolist()]
    assert Counter(ids) == Counter(range(100, 2 * ROWS))
    assert quick_batches.taken and not any(quick_batches.taken)


def test_batches_end_where_the_read_stops() -> None:
    assert row_groups.ending_at(16_384, 12_000, 20_000) == 12_000  # one batch, to the stop
    assert row_groups.ending_at(16_384, 30_000, 40_000) == 15_000  # two even ones
    assert row_groups.ending_at(16_384, 30_001, 40_000) == 15_001  # (a row past it)
    assert row_groups.ending_at(16_384, 20_000, 20_000) == 16_384  # to the end: as they were
    assert row_groups.ending_at(16_384, 0, 20_000) == 16_384
    for most in (1, 7, 1_000, 16_384):
        for stop in (1, 999, 1_000, 1_001, 33_333):
            rows = row_groups.ending_at(most, stop, 10**6)
            batches = -(-stop // rows)
            assert rows <= most and batches * rows >= stop and (batches - 1) * rows < stop
            assert batches == -(-stop // most)  # no more batches than before


def test_a_read_that_stops_inside_a_row_group_decodes_no_row_past_it(tmp_path: Path) -> None:
    path = tmp_path / "narrow.parquet"
    pq.write_table(pa.table({"id": np.arange(30_000)}), path, row_group_size=10_000)
    fs = FileSystemSpec.for_path(str(path))
    fmt = ParquetFormat()
    planned = fmt.plan(Listing.of(list_files(str(path), fs)), fs, ReadOptions(split_rows=10_000))
    options = planned.read_options or ReadOptions()
    rng = np.random.default_rng(0)
    for chunk in planned.chunks:
        for _ in range(20):
            lo, hi = sorted(int(x) for x in rng.integers(0, chunk.num_rows + 1, 2))
            batches = list(fmt.read(chunk, lo, hi, fs, options))
            ids = [i for b in batches for i in b.column("id").to_pylist()]
            first = sum(c.num_rows for c in planned.chunks[: planned.chunks.index(chunk)])
            assert ids == list(range(first + lo, first + hi))
            if lo < hi < chunk.num_rows:
                # The values buffer decoded for the last batch ends at the stop, not at the
                # row group's end (a slice keeps its whole batch's buffer).
                last = batches[-1].column("id")
                assert (last.offset + len(last)) * 8 <= last.buffers()[1].size <= hi * 8 + 8
        fmt.close()
