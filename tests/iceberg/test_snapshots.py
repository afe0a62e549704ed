"""Which snapshot is read: pinned at planning; by id, time, branch, tag; incremental appends."""

from __future__ import annotations

import time
from datetime import datetime, timezone

import pytest

from tests.iceberg.conftest import (
    Catalog,
    batch_ids,
    commit_position_deletes,
    data_files,
    flat,
    rows,
)
from tests.iceberg.conftest import loader as make_loader
from torch_dataloader_utils import InvalidArgumentError
from torch_dataloader_utils.iceberg import UnsupportedTableError

pytestmark = [
    pytest.mark.timeout(120),
    pytest.mark.filterwarnings("ignore:This DataLoader will create:UserWarning"),
]


def ids(catalog: Catalog, **options: object) -> list[int]:
    load, _ = make_loader(catalog, "snaps", **options)
    return sorted(flat(batch_ids(load)))


@pytest.fixture
def history(catalog: Catalog) -> list[tuple[int, int]]:
    """db.snaps: three appends of 100 rows; returns (snapshot id, commit ms) of each."""
    table = catalog.create("snaps")
    out = []
    for k in range(3):
        table.append(rows(range(k * 100, (k + 1) * 100)))
        snapshot = table.current_snapshot()
        out.append((snapshot.snapshot_id, snapshot.timestamp_ms))
        time.sleep(0.005)  # distinct commit times
    return out


def test_current_snapshot_by_default(catalog: Catalog, history: list[tuple[int, int]]) -> None:
    load, dataset = make_loader(catalog, "snaps")
    assert dataset.snapshot_id == history[-1][0]
    assert sorted(flat(batch_ids(load))) == list(range(300))


def test_snapshot_id(catalog: Catalog, history: list[tuple[int, int]]) -> None:
    assert ids(catalog, snapshot_id=history[0][0]) == list(range(100))
    assert ids(catalog, snapshot_id=history[1][0]) == list(range(200))


def test_as_of_datetime_and_millis(catalog: Catalog, history: list[tuple[int, int]]) -> None:
    at = history[1][1]
    assert ids(catalog, as_of=at) == list(range(200))
    assert ids(catalog, as_of=at - 1) == list(range(100))
    when = datetime.fromtimestamp(at / 1000, tz=timezone.utc)
    assert ids(catalog, as_of=when) == list(range(200))
    with pytest.raises(InvalidArgumentError, match="no snapshot at or before"):
        ids(catalog, as_of=history[0][1] - 60_000)


def test_branch_and_tag(catalog: Catalog, history: list[tuple[int, int]]) -> None:
    table = catalog.load("snaps")
    table.manage_snapshots().create_tag(history[0][0], "v1").commit()
    table.manage_snapshots().create_branch(history[1][0], "dev").commit()
    table.append(rows(range(1000, 1050)), branch="dev")
    assert ids(catalog, ref="v1") == list(range(100))
    assert ids(catalog, ref="dev") == [*range(200), *range(1000, 1050)]
    assert ids(catalog) == list(range(300))  # main is unchanged
    with pytest.raises(InvalidArgumentError, match="no branch or tag 'nope'"):
        ids(catalog, ref="nope")


def test_incremental_appends(catalog: Catalog, history: list[tuple[int, int]]) -> None:
    first, second, third = (s for s, _ in history)
    assert ids(catalog, from_snapshot_id=first) == list(range(100, 300))
    assert ids(catalog, from_snapshot_id=first, snapshot_id=second) == list(range(100, 200))
    assert ids(catalog, from_snapshot_id=third) == []
    load, dataset = make_loader(catalog, "snaps", from_snapshot_id=first, num_workers=2)
    assert dataset.snapshot_id == third
    assert sorted(flat(batch_ids(load))) == list(range(100, 300))


def test_incremental_refuses_non_appends(catalog: Catalog, history: list[tuple[int, int]]) -> None:
    table = catalog.load("snaps")
    commit_position_deletes(table, {data_files(table)[0].file_path: [0]})
    table = catalog.load("snaps")
    table.append(rows(range(500, 510)))
    with pytest.raises(UnsupportedTableError, match="'delete' operation, not an append"):
        ids(catalog, from_snapshot_id=history[0][0])
    # After the delete, only appends: fine.
    after = next(s for s in table.snapshots() if s.summary.operation.value == "delete")
    assert ids(catalog, from_snapshot_id=after.snapshot_id) == list(range(500, 510))


def test_incremental_start_must_be_an_ancestor(
    catalog: Catalog, history: list[tuple[int, int]]
) -> None:
    table = catalog.load("snaps")
    table.manage_snapshots().create_branch(history[0][0], "side").commit()
    table.append(rows(range(900, 910)), branch="side")
    side = table.refresh().snapshot_by_name("side").snapshot_id
    with pytest.raises(InvalidArgumentError, match="not an ancestor"):
        ids(catalog, from_snapshot_id=side)


def test_unknown_snapshot(catalog: Catalog, history: list[tuple[int, int]]) -> None:
    with pytest.raises(InvalidArgumentError, match="has no snapshot 12345") as info:
        ids(catalog, snapshot_id=12345)
    assert str(history[-1][0]) in str(info.value)  # lists the snapshots there are


@pytest.mark.parametrize(
    "options",
    [
        {"snapshot_id": 1, "ref": "main"},
        {"as_of": 1, "snapshot_id": 1},
        {"snapshot_id": "1"},
        {"as_of": 1.5},
        {"ref": ""},
        {"from_snapshot_id": True},
    ],
)
def test_selector_arguments_are_checked(catalog: Catalog, options: dict[str, object]) -> None:
    with pytest.raises(InvalidArgumentError):
        make_loader(catalog, "never-loaded", **options)


def test_pinned_snapshot_ignores_later_commits(
    catalog: Catalog, history: list[tuple[int, int]]
) -> None:
    load, dataset = make_loader(catalog, "snaps", num_workers=2)
    catalog.load("snaps").append(rows(range(700, 800)))  # lands after planning
    for epoch in range(2):
        dataset.set_epoch(epoch)
        assert sorted(flat(batch_ids(load))) == list(range(300))
