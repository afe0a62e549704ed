"""Delta tables through the table contract (`testing.check_table`) and against deltalake's own
reading: deletion vectors (inline, ``"u"`` and ``"p"`` files), column mapping (``name``, ``id``),
partition columns, pruning by partition values and statistics, time travel by version and by
time over appends, an overwrite and a checkpoint; bad input refused at planning."""

from __future__ import annotations

import dataclasses
import json
from datetime import UTC, datetime
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pytest

from tests.delta.tables import (
    HandTable,
    set_commit_time,
    write_dv_table,
    write_partitioned_table,
)
from torch_dataloader_utils.errors import (
    CorruptFileError,
    FilterTypeError,
    InvalidArgumentError,
    StorageNotFoundError,
    UnsupportedTableError,
)
from torch_dataloader_utils.fs import FileSystemSpec
from torch_dataloader_utils.sources.table_kinds import table_kind
from torch_dataloader_utils.sources.table_planning import plan_table
from torch_dataloader_utils.sources.tables import TableRequest, VersionSelector
from torch_dataloader_utils.testing.tables import check_table

deltalake = pytest.importorskip("deltalake")
pytestmark = pytest.mark.timeout(240)
FS = FileSystemSpec("file")
T0 = 1_800_000_000  # commit times (seconds) of the time-travel table: T0 + 100 * version


def _read(root: Path, **request: object) -> pa.Table:
    """Every row of the table as our kind plans and reads it."""
    kind = table_kind("delta")
    planned = plan_table(kind, TableRequest(str(root), **request), FS)  # type: ignore[arg-type]
    fmt = kind.format()
    batches = [
        b for c in planned.plan.chunks for b in fmt.read(c, 0, c.num_rows, FS, planned.read_options)
    ]
    fmt.close()
    return pa.Table.from_batches(batches, schema=planned.plan.schema)


def _oracle(root: Path, version: int | None = None) -> pa.Table:
    """deltalake's reading (DataFusion: deletion vectors and column mapping applied)."""
    table = deltalake.DeltaTable(str(root), version=version)
    query = deltalake.QueryBuilder().register("t", table).execute("select * from t")
    return pa.table(query.read_all())


def _sorted(table: pa.Table, names: list[str]) -> list[dict[str, object]]:
    return sorted(table.select(names).to_pylist(), key=lambda row: row["id"])


@pytest.mark.parametrize(
    ("mode", "absolute", "nested"),
    [(None, False, False), ("name", True, True), ("id", False, True)],
)
def test_deletion_vectors_and_column_mapping_conform(
    tmp_path: Path, mode: str | None, absolute: bool, nested: bool
) -> None:
    table = write_dv_table(tmp_path / "t", mode=mode, absolute=absolute, nested=nested)
    live = table.live()

    def change() -> None:
        table.commit([table.write_file("part-9.parquet", range(900, 930), row_group_size=10)])

    planned = check_table(
        table_kind("delta"),
        TableRequest(str(tmp_path / "t")),
        id_column="id",
        expected=live,
        change=change,
        missing_version=7,
    )
    assert dict(planned.plan.details)["version"] == "0"
    assert planned.plan.num_rows == len(live) == 460 - 44 - 2 - 20
    # deltalake agrees on every value of every live row (names, tokens: column mapping).
    ours, theirs = _read(tmp_path / "t", version=VersionSelector(0)), _oracle(tmp_path / "t", 0)
    names = ["id", "label", "name", "score", "tokens", *(["meta"] if nested else [])]
    assert _sorted(ours, names) == _sorted(theirs, names)
    if nested:  # a struct's fields under their logical names, from their physical ones
        for row in _sorted(ours, ["id", "meta"]):
            i = int(str(row["id"]))
            assert row["meta"] == {"a": 2 * i, "b": f"m{i}"}


def test_a_partitioned_table_with_mapped_names_and_pruning(tmp_path: Path) -> None:
    table = write_partitioned_table(tmp_path / "p", mode="name")
    live = table.live()
    assert len(live) == 139
    check_table(
        table_kind("delta"),
        TableRequest(str(tmp_path / "p"), split_rows=15),
        id_column="id",
        expected=live,
    )
    request = TableRequest(
        str(tmp_path / "p"), filters=(pc.field("label") == 3) | (pc.field("id") < 2)
    )
    check_table(
        table_kind("delta"),
        request,
        id_column="id",
        expected=[i for i in live if i % 7 == 3 or i < 2],
    )
    opened = table_kind("delta").open(request, FS)
    pruned = opened.files(("id", "label"), FS)  # labels 3, 0 and 1 (ids 0, 1) may match
    assert sorted(Path(f.path).parent.name for f in pruned) == ["label=0", "label=1", "label=3"]
    ours = _read(tmp_path / "p", columns=("label", "id"))
    assert ours.schema.names == ["label", "id"] and ours.schema.field("label").type == pa.int32()
    assert _sorted(ours, ["id", "label"]) == _sorted(_oracle(tmp_path / "p"), ["id", "label"])


@pytest.fixture(scope="module")
def travel(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[list[int]]]:
    """A deltalake table: v0 ids 0-99, v1 appends 100-149, v2 overwrites with 1000-1059 (and a
    checkpoint), v3 appends 2000-2019; commit v at T0 + 100 v. Returns it and each version's
    ids."""
    from deltalake import DeltaTable, write_deltalake

    from tests.delta.tables import make_rows

    root = tmp_path_factory.mktemp("delta") / "travel"
    steps = [
        (range(0, 100), "append"),
        (range(100, 150), "append"),
        (range(1000, 1060), "overwrite"),
        (range(2000, 2020), "append"),
    ]
    versions: list[list[int]] = []
    for version, (ids, mode) in enumerate(steps):
        if mode == "overwrite":
            write_deltalake(str(root), pa.table(make_rows(ids)), mode="overwrite")
        else:
            write_deltalake(str(root), pa.table(make_rows(ids)), mode="append")
        previous = versions[-1] if versions and mode == "append" else []
        versions.append(sorted([*previous, *ids]))
        if version == 2:
            DeltaTable(str(root)).create_checkpoint()
    for version in range(4):
        set_commit_time(root, version, T0 + 100 * version)
    return root, versions


def test_time_travel_by_version_and_by_time(travel: tuple[Path, list[list[int]]]) -> None:
    root, versions = travel
    assert (root / "_delta_log" / f"{2:020d}.checkpoint.parquet").exists()
    for version, ids in enumerate(versions):
        got = _read(root, version=VersionSelector(version)).column("id").to_pylist()
        assert sorted(got) == ids
        oracle = deltalake.DeltaTable(str(root), version=version).to_pyarrow_table()
        assert sorted(oracle.column("id").to_pylist()) == ids
    assert sorted(_read(root).column("id").to_pylist()) == versions[3]  # the latest
    as_of: dict[datetime | int, int] = {
        datetime.fromtimestamp(T0 + 150, tz=UTC): 1,  # between v1 and v2
        (T0 + 200) * 1000: 2,  # epoch ms: exactly v2's commit
        datetime.fromtimestamp(T0 + 10_000, tz=UTC): 3,
    }
    kind = table_kind("delta")
    for instant, version in as_of.items():
        request = TableRequest(str(root), version=VersionSelector(as_of=instant))
        assert kind.open(request, FS).version.id == version
        assert (
            sorted(_read(root, version=VersionSelector(as_of=instant)).column("id").to_pylist())
            == versions[version]
        )


def test_bad_versions_are_refused_with_the_versions_there_are(
    travel: tuple[Path, list[list[int]]],
) -> None:
    root, _ = travel
    kind = table_kind("delta")

    def opened(**asked: object) -> object:
        return kind.open(TableRequest(str(root), version=VersionSelector(**asked)), FS)  # type: ignore[arg-type]

    with pytest.raises(
        InvalidArgumentError, match=r"travel has no version 9; its versions: 0\.\.3"
    ):
        opened(version=9)
    with pytest.raises(InvalidArgumentError, match="before its first commit"):
        opened(as_of=datetime.fromtimestamp(T0 - 100, tz=UTC))
    with pytest.raises(InvalidArgumentError, match="no branches"):
        opened(ref="main")
    with pytest.raises(InvalidArgumentError, match="not both"):
        opened(version=1, as_of=T0 * 1000)
    with pytest.raises(InvalidArgumentError, match="not a Delta version"):
        opened(version="v1")
    with pytest.raises(FilterTypeError, match=r"pyarrow\.compute\.Expression"):
        kind.open(TableRequest(str(root), filters="id > 3"), FS)


def test_a_missing_table_and_an_unknown_reader_feature(tmp_path: Path) -> None:
    kind = table_kind("delta")
    with pytest.raises(StorageNotFoundError, match="nothing-here"):
        kind.open(TableRequest(str(tmp_path / "nothing-here")), FS)
    (tmp_path / "empty" / "_delta_log").mkdir(parents=True)
    with pytest.raises(StorageNotFoundError, match="no Delta table"):
        kind.open(TableRequest(str(tmp_path / "empty")), FS)
    future = HandTable(tmp_path / "future", reader_features=["deletionVectors", "futureFeatureX"])
    future.commit([future.write_file("a.parquet", range(10), row_group_size=5)])
    with pytest.raises(UnsupportedTableError, match="'futureFeatureX'"):
        kind.open(TableRequest(str(tmp_path / "future")), FS)
    # A feature deltalake reads but this library does not: refused by our own check.
    log = tmp_path / "future" / "_delta_log" / f"{0:020d}.json"
    lines = [json.loads(line) for line in log.read_text().splitlines()]
    lines[0]["protocol"]["readerFeatures"] = ["deletionVectors", "variantType"]
    lines[0]["protocol"]["writerFeatures"] = ["deletionVectors", "variantType"]
    log.write_text("\n".join(json.dumps(a) for a in lines) + "\n")
    with pytest.raises(UnsupportedTableError, match="variantType"):
        kind.open(TableRequest(str(tmp_path / "future")), FS)


def test_a_corrupt_deletion_vector_file_is_named_at_planning(tmp_path: Path) -> None:
    table = HandTable(tmp_path / "bad")
    adds = {"a.parquet": table.write_file("a.parquet", range(50), row_group_size=10)}
    path = table.file_dvs(adds, {"a.parquet": [1, 2, 3]}, bad_crc=True)
    table.commit(list(adds.values()))
    with pytest.raises(CorruptFileError, match=f"{path.name}.*CRC-32"):
        plan_table(table_kind("delta"), TableRequest(str(tmp_path / "bad")), FS)
    # A vector file that vanished: named too.
    path.unlink()
    with pytest.raises(StorageNotFoundError, match=path.name):
        plan_table(table_kind("delta"), TableRequest(str(tmp_path / "bad")), FS)


def test_a_checkpointed_table_with_deletion_vectors(tmp_path: Path) -> None:
    table = write_dv_table(tmp_path / "t", mode="id")
    table.commit([table.write_file("part-9.parquet", range(900, 930), row_group_size=10)])
    deltalake.DeltaTable(str(tmp_path / "t")).create_checkpoint()  # vectors in the checkpoint
    table.commit([table.write_file("part-10.parquet", range(950, 960), row_group_size=10)])
    assert sorted(_read(tmp_path / "t").column("id").to_pylist()) == table.live()
    again = dataclasses.replace(TableRequest(str(tmp_path / "t")), columns=("id",))
    assert (
        sorted(_read(tmp_path / "t", columns=again.columns).column("id").to_pylist())
        == table.live()
    )
