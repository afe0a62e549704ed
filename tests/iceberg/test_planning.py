"""Planning from metadata: row-group chunks from manifests (split offsets, record counts) and
footers, and the live-row arithmetic of positional deletes, checked by brute force."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any
from unittest import mock

import numpy as np
import pyarrow.parquet as pq
import pytest
from pyiceberg.io.pyarrow import parquet_file_to_data_file

from tests.iceberg.conftest import GROUP_ROWS, Catalog, batch_ids, flat, loader, rows
from torch_dataloader_utils import CorruptFileError
from torch_dataloader_utils.iceberg import deletes, planning
from torch_dataloader_utils.sources import table_deletes

pytestmark = pytest.mark.timeout(120)

_SPLIT_OFFSETS = 13  # position of split_offsets in a DataFile record


@pytest.mark.parametrize(
    ("offsets", "size", "valid"),
    [
        ([4], 100, True),
        ([4, 50, 90], 100, True),
        (None, 100, False),
        ([], 100, False),
        ([0], 100, False),  # inside the magic
        ([4, 4], 100, False),  # not strictly increasing
        ([4, 60, 50], 100, False),
        ([4, 100], 100, False),  # past the end
    ],
)
def test_valid_split_offsets(offsets: list[int] | None, size: int, valid: bool) -> None:
    got = planning.valid_split_offsets(offsets, size)
    assert (got == offsets) if valid else got is None


def test_single_row_group_files_are_planned_without_footers(catalog: Catalog) -> None:
    catalog.create("small", [range(k * 80, (k + 1) * 80) for k in range(5)])
    with mock.patch.object(planning, "file_metadata", side_effect=AssertionError("footer read")):
        load, dataset = loader(catalog, "small")
    assert [c.num_rows for c in dataset.plan.chunks] == [80] * 5
    assert sorted(flat(batch_ids(load))) == list(range(400))


def test_footers_of_multi_row_group_files_are_read_once(catalog: Catalog) -> None:
    catalog.create("multi", [range(250), range(250, 260)])
    with mock.patch.object(planning, "file_metadata", wraps=planning.file_metadata) as footer:
        _, dataset = loader(catalog, "multi")
    assert footer.call_count == 1  # the 3-row-group file only
    assert sorted(c.num_rows for c in dataset.plan.chunks) == [10, 50, 100, 100]


def _append_with_offsets(catalog: Catalog, name: str, path: Path, offsets: Any) -> None:
    table = catalog.load(name)
    data_file = parquet_file_to_data_file(table.io, table.metadata, f"file://{path}")
    data_file[_SPLIT_OFFSETS] = offsets
    with table.transaction() as transaction, transaction.update_snapshot().fast_append() as add:
        add.append_data_file(data_file)


@pytest.mark.parametrize("offsets", [None, [4, 2, 9], [10**9]])
def test_untrustworthy_split_offsets_fall_back_to_the_footer(
    catalog: Catalog, offsets: Any
) -> None:
    catalog.create("bad", [range(100)])
    path = catalog.root / "foreign.parquet"
    pq.write_table(rows(range(100, 400)), path, row_group_size=GROUP_ROWS)
    table = catalog.load("bad")
    mapping = table.schema().name_mapping.model_dump_json()
    with table.transaction() as transaction:  # a file without field ids needs a name mapping
        transaction.set_properties(**{"schema.name-mapping.default": mapping})
    _append_with_offsets(catalog, "bad", path, offsets)
    load, dataset = loader(catalog, "bad", num_workers=2)
    assert sorted(c.num_rows for c in dataset.plan.chunks) == [100] * 4
    assert Counter(flat(batch_ids(load))) == Counter(range(400))


def test_a_file_changed_after_its_commit(catalog: Catalog) -> None:
    table = catalog.create("changed", [range(300)])
    path = table.scan().plan_files()[0].file.file_path.removeprefix("file://")
    pq.write_table(rows(range(250)), path, row_group_size=GROUP_ROWS)
    with pytest.raises(CorruptFileError, match="manifest"):
        loader(catalog, "changed")


# --- live-row arithmetic, against a brute-force reference --------------------------------------


def test_physical_range_and_mask_brute_force() -> None:
    rng = np.random.default_rng(0)
    for _ in range(300):
        n = int(rng.integers(0, 40))
        deleted = np.sort(rng.choice(n, size=int(rng.integers(0, n + 1)), replace=False))
        deleted = deleted.astype(np.int64)
        live = [i for i in range(n) if i not in set(deleted.tolist())]
        for a in range(len(live) + 1):
            for b in range(a, len(live) + 1):
                start, stop = table_deletes.physical_range(deleted, a, b)
                if a == b:
                    continue
                assert start == live[a] and stop == live[b - 1] + 1
                mask = table_deletes.keep_mask(deleted, start, stop - start)
                kept = [p for k, p in enumerate(range(start, stop)) if mask is None or mask[k]]
                assert kept == live[a:b]
        assert table_deletes.live_rows(deleted, 0, n) == len(live)
        assert table_deletes.live_positions(deleted, 0, n).tolist() == live
        cut = int(rng.integers(0, n + 1))
        assert table_deletes.live_positions(deleted, cut, n).tolist() == [
            p for p in live if p >= cut
        ]


def test_deleted_in_shifts_to_the_range() -> None:
    positions = np.array([1, 5, 10, 15, 20], dtype=np.int64)
    assert table_deletes.deleted_in(positions, 5, 16).tolist() == [0, 5, 10]
    assert table_deletes.live_rows(positions, 5, 16) == 8


def test_merge_positions_unions_delete_files() -> None:
    a = {"f": np.array([5, 1, 3]), "g": np.array([0])}
    b = {"f": np.array([3, 9])}
    assert deletes.merge_positions([a, b], "f").tolist() == [1, 3, 5, 9]
    assert deletes.merge_positions([a, b], "h").tolist() == []
