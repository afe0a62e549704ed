"""Wide rows in one big row group: read in batches bounded by bytes, not sampled whole at
planning, and every row read exactly once with shuffling, in-process and in worker processes.

(Memory itself is measured by benchmarks/memory.py, never asserted here.)
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import torch_dataloader_utils as tdu
from torch_dataloader_utils.formats.parquet import ParquetFormat, row_groups
from torch_dataloader_utils.fs import FileSystemSpec
from torch_dataloader_utils.sources import files as planner
from torch_dataloader_utils.sources.broadcast import Spread
from torch_dataloader_utils.sources.steps import plan_files

pytestmark = [
    pytest.mark.timeout(60),
    pytest.mark.filterwarnings("ignore:This DataLoader will create:UserWarning"),
]

ROWS = 48
VALUE_BYTES = 256 << 10  # 32 rows make a byte-capped read batch (8 MiB)


def blob(i: int) -> bytes:
    """Row ``i``'s value: its id, then filler (a row's content checks its id)."""
    return int(i).to_bytes(8, "little") + bytes([i % 251]) * (VALUE_BYTES - 8)


def write_wide(path: Path, *, paged: bool) -> Path:
    """``pq.write_table``'s defaults: one row group, every value in one dictionary page; or
    ``write_batch_size=1``: one value per page."""
    path.parent.mkdir(parents=True, exist_ok=True)
    table = pa.table(
        {"id": np.arange(ROWS), "blob": pa.array([blob(i) for i in range(ROWS)], pa.binary())}
    )
    pq.write_table(table, path, **({"write_batch_size": 1} if paged else {}))
    assert pq.read_metadata(path).num_row_groups == 1
    return path


class RecordingParquet(ParquetFormat):
    """Records the row ranges read (planning's sample is the only read before iterating)."""

    def __init__(self) -> None:
        super().__init__()
        self.reads: list[tuple[int, int]] = []

    def read(self, chunk: Any, row_start: int, row_stop: int, *args: Any) -> Any:
        self.reads.append((row_start, row_stop))
        return super().read(chunk, row_start, row_stop, *args)


def plan(path: Path, fmt: ParquetFormat, columns: list[str] | None = None) -> planner.Planned:
    return plan_files(
        str(path),
        fmt,
        FileSystemSpec.for_path(str(path)),
        spread=Spread(explicit=True),
        kept=None,
        cache=None,
        columns=columns,
        filters=None,
        partitioning=None,
        split_bytes=None,
        split_rows=None,
    )


@pytest.mark.parametrize("paged", [False, True])
def test_a_wide_row_group_is_read_in_batches_of_bounded_bytes(tmp_path: Path, paged: bool) -> None:
    path = write_wide(tmp_path / "wide.parquet", paged=paged)
    fmt = ParquetFormat()
    planned = plan(path, fmt)
    (chunk,) = planned.plan.chunks
    fs = FileSystemSpec.for_path(str(path))
    cap = row_groups._READ_BATCH_BYTES // VALUE_BYTES
    try:
        for start, stop in [(0, ROWS), (5, 40), (33, 34)]:
            batches = list(fmt.read(chunk, start, stop, fs, planned.read_options))
            assert all(b.num_rows <= cap for b in batches)
            table = pa.Table.from_batches(batches)
            assert table["id"].to_pylist() == list(range(start, stop))
            assert table["blob"].to_pylist() == [blob(i) for i in range(start, stop)]
        # The cap counts the columns read: without the wide one, the row group is one batch.
        narrow = plan(path, fmt, columns=["id"])
        (batch,) = fmt.read(chunk, 0, ROWS, fs, narrow.read_options)
        assert batch.num_rows == ROWS
    finally:
        fmt.close()


def test_planning_does_not_decode_wide_rows(tmp_path: Path) -> None:
    fmt = RecordingParquet()
    planned = plan(write_wide(tmp_path / "wide.parquet", paged=False), fmt)
    assert fmt.reads == []  # the footer's size stands: decoding a row decodes its whole page
    assert planned.decoded_row_bytes == planned.plan.row_bytes >= VALUE_BYTES


def test_planning_samples_about_a_fixed_number_of_bytes(tmp_path: Path) -> None:
    path = tmp_path / "mid.parquet"
    rows, width = 4096, 16 << 10  # under the wide threshold: sampled
    values = pa.array([bytes([i % 251]) * width for i in range(rows)], pa.binary())
    pq.write_table(pa.table({"id": np.arange(rows), "value": values}), path)
    fmt = RecordingParquet()
    planned = plan(path, fmt)
    ((start, stop),) = fmt.reads
    assert start == 0 and stop == planner._SAMPLE_BYTES // int(planned.plan.row_bytes)
    assert stop < planner._SAMPLE_ROWS
    assert planned.decoded_row_bytes >= width


@pytest.mark.parametrize("num_workers", [0, 2])
@pytest.mark.parametrize("paged", [False, True])
def test_wide_rows_in_one_row_group_read_every_row_once(
    tmp_path: Path, num_workers: int, paged: bool
) -> None:
    path = write_wide(tmp_path / "wide.parquet", paged=paged)
    loader, dataset = tdu.StructuredDataset.create_dataloader(
        str(path),
        batch_size=4,
        shuffle=True,
        shuffle_block_bytes=9 * VALUE_BYTES,  # 8 rows a block (whole batches)
        num_workers=num_workers,
        timeout=30 if num_workers else 0,
    )
    assert dataset.block_rows == 8
    orders = []
    for epoch in range(2):
        dataset.set_epoch(epoch)
        ids: list[int] = []
        for batch in loader:
            batch_ids = batch["id"].tolist()
            assert [int.from_bytes(b[:8], "little") for b in batch["blob"]] == batch_ids
            assert [len(b) for b in batch["blob"]] == [VALUE_BYTES] * len(batch_ids)
            ids += batch_ids
        assert Counter(ids) == Counter(range(ROWS))
        orders.append(ids)
    assert orders[0] != orders[1] and orders[0] != sorted(orders[0])  # rows were shuffled
