"""The Lance table kind against the table contract (`testing.tables.check_table`) on datasets
pylance writes (fragments, appends, deletion files, an overwrite), and its planning: the version
pinned and travelled to (by number, tag and time), the plan's details, and the errors of bad
input, raised at planning and naming the dataset."""

from __future__ import annotations

import time
from datetime import datetime, timedelta, timezone
from pathlib import Path

import lance
import pyarrow.compute as pc
import pytest

from tests.lance.data import append, live_ids, oracle, overwrite, write_dataset
from torch_dataloader_utils import (
    InvalidArgumentError,
    Source,
    StorageNotFoundError,
)
from torch_dataloader_utils.dataset.tables import plan_table
from torch_dataloader_utils.fs import FileSystemSpec
from torch_dataloader_utils.lance.format import LanceFormat
from torch_dataloader_utils.lance.table import LanceTables
from torch_dataloader_utils.sources.table_planning import plan_table as plan_request
from torch_dataloader_utils.sources.tables import TableRequest, VersionSelector
from torch_dataloader_utils.testing.tables import check_table

pytestmark = pytest.mark.timeout(240)

LOCAL = FileSystemSpec("file")


@pytest.fixture(scope="module")
def shared(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A dataset at versions 1-4 that no test changes."""
    return write_dataset(tmp_path_factory.mktemp("lance") / "shared.lance")


def _plan(uri: str, **source: object) -> dict[str, str]:
    return dict(plan_table(Source(uri, format="lance", **source), LOCAL).plan.details)


def test_the_lance_kind_conforms(tmp_path: Path) -> None:
    uri = write_dataset(tmp_path / "t.lance")
    assert sorted(oracle(uri)["id"].to_pylist()) == live_ids(4)
    planned = check_table(
        LanceTables(unit_rows=16),  # fragments of several units, units cut by deletes
        TableRequest(uri),
        id_column="id",
        expected=live_ids(4),
        change=lambda: append(uri, range(1000, 1010)),
        missing_version=99,
    )
    assert dict(planned.plan.details)["version"] == "4"
    assert max(c.num_rows for c in planned.plan.chunks) == 16


def test_the_lance_kind_conforms_at_an_old_version_with_a_filter(shared: str) -> None:
    request = TableRequest(
        shared, version=VersionSelector(version=2), filters=pc.field("label") == 2, split_rows=50
    )
    expected = [i for i in live_ids(2) if i % 7 == 2]
    check_table(LanceTables(unit_rows=16), request, id_column="id", expected=expected)


def test_a_plan_pins_the_version_and_counts_live_rows(shared: str) -> None:
    planned = plan_table(Source(shared, format="lance"), LOCAL)
    details = dict(planned.plan.details)
    assert (details["format"], details["version"], details["table_id"]) == (
        "lance",
        "4",
        "shared.lance",
    )
    assert planned.plan.num_rows == len(live_ids(4)) == oracle(shared).num_rows
    fragments = lance.dataset(shared).get_fragments()
    # One chunk a fragment (each under a unit), named by its first data file.
    assert sorted(c.path for c in planned.plan.chunks) == sorted(
        f"{shared}/data/{f.data_files()[0].path}" for f in fragments
    )
    assert sorted(c.num_rows for c in planned.plan.chunks) == sorted(
        f.count_rows() for f in fragments
    )


def test_time_travel_by_version_tag_and_time(tmp_path: Path) -> None:
    uri = write_dataset(tmp_path / "tt.lance", versions=2)
    time.sleep(0.05)
    between = datetime.now(timezone.utc)
    time.sleep(0.05)
    overwrite(uri, range(5000, 5040))  # version 3
    lance.dataset(uri).tags.create("before-overwrite", 2)
    fs = LOCAL
    for selector, version, ids in [
        (VersionSelector(), 3, list(range(5000, 5040))),
        (VersionSelector(version=1), 1, live_ids(1)),
        (VersionSelector(version="2"), 2, live_ids(2)),
        (VersionSelector(ref="before-overwrite"), 2, live_ids(2)),
        (VersionSelector(as_of=between), 2, live_ids(2)),
        (VersionSelector(as_of=int(between.timestamp() * 1000)), 2, live_ids(2)),
        (VersionSelector(as_of=between.astimezone().replace(tzinfo=None)), 2, live_ids(2)),
        (VersionSelector(as_of=datetime.now(timezone.utc) + timedelta(days=1)), 3, None),
    ]:
        planned = plan_request(LanceTables(), TableRequest(uri, version=selector), fs)
        assert dict(planned.plan.details)["version"] == str(version), selector
        if ids is not None:
            got = [
                i
                for chunk in planned.plan.chunks
                for b in LanceFormat().read(chunk, 0, chunk.num_rows, fs, planned.read_options)
                for i in b.column("id").to_pylist()
            ]
            assert sorted(got) == ids, selector
    # The loader's keywords: an ISO string as_of, a version.
    iso = between.isoformat().replace("+00:00", "Z")
    assert _plan(uri, as_of=iso)["version"] == "2"
    assert _plan(uri, version=1)["version"] == "1"


def test_bad_versions_are_refused_at_planning_naming_the_versions(shared: str) -> None:
    for source, message in [
        (
            {"version": 9},
            r"Lance dataset .*shared.lance has no version 9; its versions: 1, 2, 3, 4",
        ),
        ({"version": "no-such-tag"}, r"shared.lance has no version 'no-such-tag'"),
        ({"as_of": "2001-01-01T00:00:00Z"}, r"no version at or before as_of=.*versions: 1, 2"),
        ({"as_of": "yesterday"}, r"not an ISO 8601 time"),
        ({"version": 1, "as_of": 0}, r"at most one of version, as_of and ref"),
    ]:
        with pytest.raises(InvalidArgumentError, match=message):
            _plan(shared, **source)
    with pytest.raises(InvalidArgumentError, match="not read incrementally"):
        plan_request(LanceTables(), TableRequest(shared, version=VersionSelector(since=1)), LOCAL)


def test_a_missing_dataset_is_named_at_planning(tmp_path: Path) -> None:
    missing = tmp_path / "nothing-here.lance"
    with pytest.raises(StorageNotFoundError, match=r"nothing-here.lance.*no Lance dataset"):
        _plan(str(missing))
    (tmp_path / "empty.lance").mkdir()
    with pytest.raises(StorageNotFoundError, match=r"empty.lance"):
        _plan(str(tmp_path / "empty.lance"))


def test_a_missing_column_is_named(shared: str) -> None:
    from torch_dataloader_utils import ColumnNotFoundError

    with pytest.raises(ColumnNotFoundError, match=r"Lance dataset .*shared.lance.*'nope'"):
        _plan(shared, columns=["id", "nope"])


def test_units_follow_bytes_and_rows(shared: str) -> None:
    def units(kind: LanceTables, columns: tuple[str, ...]) -> list[tuple[int, ...]]:
        table = kind.open(TableRequest(shared), LOCAL)
        return [f.row_groups for f in table.files(columns, LOCAL)]

    whole = units(LanceTables(), ("id",))
    assert all(len(u) == 1 for u in whole)  # a fragment is one unit by default
    assert [sum(u) for u in units(LanceTables(unit_rows=7), ("id",))] == [u[0] for u in whole]
    assert all(max(u) <= 7 for u in units(LanceTables(unit_rows=7), ("id",)))
    # About 8 bytes a row of "id": units of 64 bytes hold a few rows; of all columns, fewer.
    narrow = units(LanceTables(unit_bytes=64), ("id",))
    wide = units(LanceTables(unit_bytes=64), ("id", "name", "emb", "tokens"))
    assert max(max(u) for u in narrow) > 1 and sum(map(len, wide)) > sum(map(len, narrow))
    with pytest.raises(InvalidArgumentError, match="unit_rows"):
        LanceTables(unit_rows=0)


def test_a_column_added_later_is_read_from_each_fragments_second_data_file(tmp_path: Path) -> None:
    uri = write_dataset(tmp_path / "wide.lance", versions=3)
    lance.dataset(uri).add_columns({"twice": "id * 2"})  # version 4: a data file more each
    fragments = lance.dataset(uri).get_fragments()
    assert all(len(f.data_files()) == 2 for f in fragments)
    planned = check_table(
        LanceTables(unit_rows=16),
        TableRequest(uri, columns=("twice", "id")),
        id_column="id",
        expected=live_ids(3),
    )
    assert planned.plan.schema.names == ["twice", "id"]
    fs = LOCAL
    for chunk in planned.plan.chunks:
        for batch in LanceFormat().read(chunk, 0, chunk.num_rows, fs, planned.read_options):
            assert batch.column("twice").to_pylist() == [2 * i for i in batch["id"].to_pylist()]
