"""Positional deletes applied per row-group chunk (chunks count live rows), and equality
deletes refused with a clear error."""

from __future__ import annotations

from collections import Counter

import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from tests.iceberg.conftest import (
    Catalog,
    batch_ids,
    commit_equality_deletes,
    commit_position_deletes,
    data_files,
    flat,
    loader,
)
from torch_dataloader_utils.iceberg import UnsupportedTableError
from torch_dataloader_utils.testing import check_row_ranges, read_rows

pytestmark = [
    pytest.mark.timeout(120),
    pytest.mark.filterwarnings("ignore:This DataLoader will create:UserWarning"),
]

# File sizes: 10 row groups, 3 row groups, 1 row group.
PARTS = [range(0, 1000), range(1000, 1250), range(1250, 1300)]
# Positions (file-wide row ordinals) deleted per file, by the file's first id. Row group edges,
# a later row group of the split file, a whole row group of it (300-399), the whole last file.
DELETES = {
    0: [0, 5, 99, 100, 101, *range(300, 400), 555, 998, 999],
    1000: [3, 99, 200, 249],
    1250: list(range(50)),
}
# A second delete commit: overlapping positions, and a position of a later row group.
MORE = {0: [5, 555, 777], 1000: [100]}


def _ids_of(url: str) -> list[int]:
    return pq.read_table(url.removeprefix("file://"), columns=["id"])["id"].to_pylist()


@pytest.fixture
def deleted(catalog: Catalog) -> set[int]:
    """Table db.dels with PARTS and two delete commits; returns the deleted ids."""
    table = catalog.create("dels", PARTS)
    files = {_ids_of(f.file_path)[0]: f.file_path for f in data_files(table)}
    gone = set()
    for deletes in (DELETES, MORE):
        by_path = {files[first]: positions for first, positions in deletes.items()}
        by_path["file:///elsewhere/not-a-file-of-this-table.parquet"] = [1, 2, 3]
        table = commit_position_deletes(table, by_path)
        gone |= {first + p for first, positions in deletes.items() for p in positions}
    return gone


@pytest.mark.parametrize("num_workers", [0, 2])
def test_deleted_rows_are_absent_and_the_rest_read_once(
    catalog: Catalog, deleted: set[int], num_workers: int
) -> None:
    live = [i for i in range(1300) if i not in deleted]
    load, dataset = loader(catalog, "dels", num_workers=num_workers, shuffle=True)
    assert dataset.plan.num_rows == len(live)  # chunks count live rows, at plan time
    assert sum(c.num_rows for c in dataset.plan.chunks) == len(live)
    # Row group 3 of the first file and the whole last file have no live row: no chunk.
    assert len(dataset.plan.chunks) == 9 + 3
    for epoch in range(2):
        dataset.set_epoch(epoch)
        batches = batch_ids(load)
        assert Counter(flat(batches)) == Counter(live)
        assert len(batches) == len(load)


def test_filter_applies_after_the_deletes(catalog: Catalog, deleted: set[int]) -> None:
    load, dataset = loader(catalog, "dels", filters=pc.field("label") == 2, num_workers=2)
    expected = [i for i in range(1300) if i % 7 == 2 and i not in deleted]
    assert dataset.plan.num_rows == len(expected)
    assert Counter(flat(batch_ids(load))) == Counter(expected)


def test_grouped_chunks_with_deletes_in_later_row_groups(
    catalog: Catalog, deleted: set[int]
) -> None:
    load, dataset = loader(catalog, "dels", split_rows=450, num_workers=2, shuffle=True)
    first = [c for c in dataset.plan.chunks if c.start == 0 and c.stop > 2]
    assert first, dataset.plan.chunks  # several row groups in one chunk, deletes inside
    assert Counter(flat(batch_ids(load))) == Counter(i for i in range(1300) if i not in deleted)


def test_every_live_row_range_of_every_chunk(catalog: Catalog, deleted: set[int]) -> None:
    """read(chunk, a, b) addresses live rows: each range is that slice of the whole chunk."""
    for split_rows in (None, 450):
        _, dataset = loader(catalog, "dels", split_rows=split_rows)
        fmt, fs, options = dataset.format, dataset.fs, dataset.read_options
        schema = dataset.plan.schema
        got = []
        for chunk in dataset.plan.chunks:
            full = read_rows(fmt, chunk, 0, chunk.num_rows, fs=fs, options=options, schema=schema)
            check_row_ranges(fmt, chunk, full, fs=fs, options=options, schema=schema)
            got.extend(full["id"].to_pylist())
        assert Counter(got) == Counter(i for i in range(1300) if i not in deleted)


def test_equality_deletes_are_refused(catalog: Catalog) -> None:
    table = catalog.create("eq", [range(100)])
    commit_equality_deletes(table, [5, 6])
    with pytest.raises(UnsupportedTableError, match="equality delete") as info:
        loader(catalog, "eq")
    message = str(info.value)
    assert "db.eq" in message and "rewrite_data_files" in message
    assert isinstance(info.value.__cause__, ValueError)  # pyiceberg's refusal, wrapped
    assert isinstance(info.value, ValueError)  # InvalidSourceError is a ValueError


def test_snapshot_before_equality_deletes_reads(catalog: Catalog) -> None:
    table = catalog.create("eq", [range(100)])
    before = table.current_snapshot().snapshot_id
    commit_equality_deletes(table, [5])
    load, _ = loader(catalog, "eq", snapshot_id=before)
    assert sorted(flat(batch_ids(load))) == list(range(100))


def test_rows_at_names_each_rows_place_in_its_data_file(
    catalog: Catalog, deleted: set[int]
) -> None:
    # Row r of a file holds id first + r: a row's number must name its physical row, past
    # the deleted rows before it (and the whole row group 300-399 of the first file).
    load, dataset = loader(catalog, "dels", num_workers=0, shuffle=True, batch_size=97)
    dataset.set_epoch(1)
    firsts = {_ids_of(f.file_path)[0]: f.file_path for f in data_files(catalog.load("dels"))}
    seen = 0
    for b, batch in enumerate(load):
        found = load.rows_at(b, epoch=1)
        assert found.column("id").to_pylist() == batch["id"].tolist()
        for url, row, i in zip(
            found.column("__file__").to_pylist(),
            found.column("__row__").to_pylist(),
            found.column("id").to_pylist(),
            strict=True,
        ):
            first = max(f for f in firsts if f <= i)
            assert url.endswith(firsts[first].removeprefix("file://"))
            assert row == i - first, (url, row, i)
            seen += 1
    assert seen == 1300 - len(deleted)
