"""The table conformance suite (`testing.tables`) on Iceberg and on a toy table kind defined
here, registered with one registry entry: a folder of Parquet files and a JSON manifest of
versions, each listing its files and their deleted positions. The toy is all a new kind needs
(a folder and `register_table`); broken toys prove that the suite fails them."""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

import torch_dataloader_utils as tdu
from tests.conftest import make_table
from torch_dataloader_utils import (
    InvalidArgumentError,
    Source,
    StorageNotFoundError,
    UnknownFormatError,
)
from torch_dataloader_utils.dataset.tables import (
    plan_table,
    table_format,
    table_kind_of,
    table_request,
)
from torch_dataloader_utils.formats import Format, FormatPlan, Listing, ReadOptions
from torch_dataloader_utils.formats.opening import open_input
from torch_dataloader_utils.formats.parquet import ParquetFormat
from torch_dataloader_utils.fs import FileSystemSpec, ListedFile
from torch_dataloader_utils.planning import Chunk
from torch_dataloader_utils.sources.table_deletes import deleted_in, keep_mask, physical_range
from torch_dataloader_utils.sources.table_kinds import register_table, table_entry, table_kind
from torch_dataloader_utils.sources.tables import (
    TableFile,
    TableFilter,
    TableRequest,
    TableSchema,
    TableVersion,
)
from torch_dataloader_utils.testing.tables import check_table

pytestmark = pytest.mark.timeout(240)

MANIFEST = "_versions.json"

# --- the toy table kind: one folder, one registry entry ------------------------------------------


@dataclass(frozen=True)
class ToyFile:
    """What the toy format needs of a data file: its row groups and deleted positions."""

    path: str
    row_groups: tuple[int, ...]
    deleted: tuple[int, ...]


@dataclass(frozen=True)
class ToyReadOptions(ReadOptions):
    """`ReadOptions` of a toy table: its data files."""

    files: tuple[ToyFile, ...] = ()


class ToyFormat(Format):
    """Parquet data files with deleted rows dropped: ``read`` addresses live rows."""

    name = "toy"

    def __init__(self) -> None:
        self._parquet = ParquetFormat()

    def __reduce__(self) -> tuple[type[ToyFormat], tuple[()]]:
        return (type(self), ())

    def schema(self, file: ListedFile, fs: FileSystemSpec) -> pa.Schema:
        return self._parquet.schema(file, fs)

    def plan(self, listing: Listing, fs: FileSystemSpec, options: ReadOptions) -> FormatPlan:
        raise InvalidArgumentError("a toy table is planned from its manifest")

    def read(
        self, chunk: Chunk, row_start: int, row_stop: int, fs: FileSystemSpec, options: ReadOptions
    ) -> Iterator[pa.RecordBatch]:
        assert isinstance(options, ToyReadOptions)
        file = next(f for f in options.files if f.path == chunk.path)
        first = sum(file.row_groups[: chunk.start])
        physical = file.row_groups[chunk.start : chunk.stop]
        deleted = deleted_in(np.asarray(file.deleted, np.int64), first, first + sum(physical))
        start, stop = physical_range(deleted, row_start, min(row_stop, chunk.num_rows))
        if start >= stop:
            return
        whole = Chunk(chunk.path, chunk.start, chunk.stop, sum(physical), chunk.num_bytes, physical)
        position = start
        columns = ReadOptions(columns=options.columns)
        for batch in self._parquet.read(whole, start, stop, fs, columns):
            mask = keep_mask(deleted, position, batch.num_rows)
            position += batch.num_rows
            live = batch if mask is None else batch.filter(pa.array(mask))
            if live.num_rows:
                yield live

    def close(self) -> None:
        self._parquet.close()


class ToyTable:
    """A toy table at one version of its manifest."""

    def __init__(
        self, root: str, version: dict[str, Any], request: TableRequest, fs: FileSystemSpec
    ) -> None:
        self.root = root
        self.label = f"toy table {root}"
        self.entry = version
        self.version = TableVersion(version["version"], {"version": version["version"]})
        self.storage = None
        self.filter = TableFilter.of(request.filters)
        first = f"{root}/{version['files'][0]}"
        arrow = ParquetFormat().schema(ListedFile(first, fs.file_size(first), ""), fs)
        self.schema = TableSchema(arrow, matched_by="name")  # (as the format reads them)

    def files(self, columns: tuple[str, ...], fs: FileSystemSpec) -> list[TableFile]:
        out = []
        for name in self.entry["files"]:
            path = f"{self.root}/{name}"
            with open_input(path, fs) as source:
                footer = pq.read_metadata(source)
            groups = [footer.row_group(i) for i in range(footer.num_row_groups)]
            rows = tuple(g.num_rows for g in groups)
            nbytes = tuple(
                sum(
                    g.column(j).total_compressed_size
                    for j in range(g.num_columns)
                    if g.column(j).path_in_schema.split(".")[0] in columns
                )
                for g in groups
            )
            deleted = tuple(sorted(set(self.entry["deleted"].get(name, ()))))
            out.append(
                TableFile(
                    path=path,
                    size=fs.file_size(path),
                    row_groups=rows,
                    row_group_bytes=nbytes,
                    deleted=np.asarray(deleted, np.int64),
                    info=ToyFile(path, rows, deleted),
                )
            )
        return out

    def read_options(self, options: ReadOptions, files: Sequence[TableFile]) -> ReadOptions:
        return ToyReadOptions.of(options, files=tuple(f.info for f in files))


class ToyTables:
    """The ``toy`` table kind: a folder of Parquet files and a manifest of versions."""

    name = "toy"
    table = ToyTable

    def format(self) -> Format:
        return ToyFormat()

    def open(self, request: TableRequest, fs: FileSystemSpec) -> ToyTable:
        root = str(request.table)
        with open_input(f"{root}/{MANIFEST}", fs) as source:  # StorageNotFoundError, named
            versions = json.loads(source.read())["versions"]
        asked = request.version.version
        if asked is None:
            return self.table(root, versions[-1], request, fs)
        for version in versions:
            if version["version"] == asked:
                return self.table(root, version, request, fs)
        raise InvalidArgumentError(f"toy table {root} has no version {asked!r}")


def write_toy(root: Path, parts: Sequence[range], deletes: dict[int, list[int]]) -> list[int]:
    """A toy table of ``parts`` (a file each, row groups of 40 rows) with ``deletes`` (file
    index -> positions) at version 0; returns the live ids."""
    root.mkdir(parents=True, exist_ok=True)
    names = []
    for i, ids in enumerate(parts):
        names.append(f"part-{i}.parquet")
        pq.write_table(make_table(np.asarray(ids)), root / names[-1], row_group_size=40)
    deleted = {names[i]: positions for i, positions in deletes.items()}
    version = {"version": 0, "files": names, "deleted": deleted}
    (root / MANIFEST).write_text(json.dumps({"versions": [version]}))
    gone = {parts[i][p] for i, positions in deletes.items() for p in positions}
    return [i for ids in parts for i in ids if i not in gone]


def commit_toy(root: Path, ids: range) -> None:
    """A new version of the toy table: one more file."""
    manifest = json.loads((root / MANIFEST).read_text())
    last = manifest["versions"][-1]
    name = f"part-{len(last['files'])}.parquet"
    pq.write_table(make_table(np.asarray(ids)), root / name, row_group_size=40)
    version = {**last, "version": last["version"] + 1, "files": [*last["files"], name]}
    manifest["versions"].append(version)
    (root / MANIFEST).write_text(json.dumps(manifest))


PARTS = (range(0, 170), range(170, 250), range(250, 270), range(270, 270))
# Row-group edges, a whole row group (40-79) of the first file, the whole third file.
DELETES = {0: [0, 39, *range(40, 80), 81, 169], 1: [3, 40], 2: list(range(20))}


@pytest.fixture
def toy(tmp_path: Path) -> tuple[Path, list[int]]:
    register_table("toy", ToyTables)  # the one registry entry (the same again is allowed)
    root = tmp_path / "toy"
    return root, write_toy(root, PARTS, DELETES)


def test_the_toy_kind_conforms(toy: tuple[Path, list[int]]) -> None:
    root, live = toy
    check_table(
        table_kind("toy"),
        TableRequest(str(root)),
        id_column="id",
        expected=live,
        change=lambda: commit_toy(root, range(1000, 1050)),
        missing_version=99,
    )


def test_the_toy_kind_conforms_with_a_filter(toy: tuple[Path, list[int]]) -> None:
    root, live = toy
    request = TableRequest(str(root), filters=pc.field("label") == 2, split_rows=50)
    check_table(
        table_kind("toy"), request, id_column="id", expected=[i for i in live if i % 7 == 2]
    )


def test_a_source_names_the_toy_kind_by_its_path(toy: tuple[Path, list[int]]) -> None:
    root, live = toy
    source = Source(str(root), format="toy", columns=["id"])
    assert table_kind_of(source) == "toy"
    assert isinstance(table_format(source), ToyFormat)
    planned = plan_table(source, FileSystemSpec("file"))
    assert planned.plan.num_rows == len(live)
    assert dict(planned.plan.details)["version"] == "0"
    with pytest.raises(InvalidArgumentError, match="read by path"):
        table_kind_of(Source(table="db.t", format="toy"))
    with pytest.raises(InvalidArgumentError, match="one location"):
        plan_table(Source([str(root), str(root)], format="toy"), FileSystemSpec("file"))


def test_a_table_read_by_path_takes_its_version_and_refuses_a_state_of_another(
    toy: tuple[Path, list[int]], tmp_path: Path
) -> None:
    root, live = toy

    def ids(loader: Any) -> list[int]:
        return sorted(i for batch in loader for i in batch["id"].tolist())

    first = tdu.create_dataloader(str(root), format="toy", batch_size=16, num_workers=0)
    next(iter(first))
    state = first.state_dict()
    commit_toy(root, range(1000, 1050))
    pinned = tdu.create_dataloader(str(root), format="toy", version=0, batch_size=16)
    assert ids(pinned) == sorted(live)
    pinned.load_state_dict(state)  # the version the state was saved at
    latest = tdu.create_dataloader(str(root), format="toy", batch_size=16, num_workers=0)
    assert ids(latest) == sorted([*live, *range(1000, 1050)])
    with pytest.raises(tdu.StateMismatchError, match=r"version 0 then, 1 now: pass version=0"):
        latest.load_state_dict(state)
    # A source of files has no version: refused, naming where a version goes.
    (tmp_path / "files").mkdir()
    pq.write_table(make_table(np.arange(4)), tmp_path / "files" / "a.parquet")
    for asked in ({"version": 3}, {"as_of": "2026-11-01T00:00:00Z"}):
        with pytest.raises(InvalidArgumentError, match="select a version of a table"):
            tdu.create_dataloader(str(tmp_path / "files"), **asked)


def test_a_tables_as_of_is_a_time_and_version_is_snapshot_id(toy: tuple[Path, list[int]]) -> None:
    root, _ = toy
    request = table_request(Source(str(root), format="toy", as_of="2026-11-01T00:00:00Z"))
    assert request.version.as_of == datetime(2026, 11, 1, tzinfo=timezone.utc)
    assert table_request(Source(table="db.t", version=5)).version.version == 5
    assert table_request(Source(table="db.t", snapshot_id=6)).version.version == 6
    with pytest.raises(InvalidArgumentError, match="pass one"):
        Source(table="db.t", version=5, snapshot_id=6)
    with pytest.raises(InvalidArgumentError, match="not an ISO 8601 time"):
        table_request(Source(str(root), format="toy", as_of="last tuesday"))


def test_what_names_a_table() -> None:
    assert table_kind_of(Source(table="db.t")) == "iceberg"
    assert table_kind_of(Source(table="db.t", format="iceberg")) == "iceberg"
    assert table_kind_of(Source("data/", format="parquet")) is None
    # An Iceberg table is read by name: a path with format="iceberg" stays files (refused as
    # an unknown format, as before table kinds).
    assert table_kind_of(Source("warehouse/db/t", format="iceberg")) is None
    entry = table_entry("ICEBERG")
    assert entry is not None and entry.address == "name"


def test_the_registry_refuses_clashes_and_bad_targets() -> None:
    target = "tests.conformance.test_tables:ToyTables"
    register_table("toy-registry", target, clobber=True)  # (whatever an earlier run left)
    register_table("toy-registry", target)  # the same again
    assert isinstance(table_kind("toy-registry"), ToyTables)  # imported when asked for
    with pytest.raises(InvalidArgumentError, match="registered already"):
        register_table("toy-registry", ToyTables)
    register_table("toy-registry", ToyTables, clobber=True)
    with pytest.raises(InvalidArgumentError, match="module:attr"):
        register_table("toy-bad", "no_colon")
    with pytest.raises(InvalidArgumentError, match="address"):
        register_table("toy-bad", ToyTables, address="url")  # type: ignore[arg-type]
    register_table("toy-missing", "tests.no_such_module:Kind")
    with pytest.raises(UnknownFormatError, match="cannot be loaded"):
        table_kind("toy-missing")
    with pytest.raises(UnknownFormatError, match="unknown table kind"):
        table_kind("nope")


# --- broken toys: the suite fails each --------------------------------------------------------


class _CountsDeletedRows(ToyTable):
    def files(self, columns: tuple[str, ...], fs: FileSystemSpec) -> list[TableFile]:
        return [_no_deletes(f) for f in super().files(columns, fs)]


def _no_deletes(file: TableFile) -> TableFile:
    return replace(file, deleted=np.empty(0, np.int64))


class _ReadsDeletedRows(ToyFormat):
    def read(
        self, chunk: Chunk, row_start: int, row_stop: int, fs: FileSystemSpec, options: ReadOptions
    ) -> Iterator[pa.RecordBatch]:
        assert isinstance(options, ToyReadOptions)
        files = tuple(ToyFile(f.path, f.row_groups, ()) for f in options.files)
        return super().read(chunk, row_start, row_stop, fs, replace(options, files=files))


class _VersionNotInDetails(ToyTable):
    def __init__(
        self, root: str, version: dict[str, Any], request: TableRequest, fs: FileSystemSpec
    ) -> None:
        super().__init__(root, version, request, fs)
        self.version = TableVersion(version["version"], {"table": root})


class _Unpinned(ToyTables):
    def open(self, request: TableRequest, fs: FileSystemSpec) -> ToyTable:
        return super().open(replace(request, version=replace(request.version, version=None)), fs)


class _ForeignErrors(ToyTables):
    def open(self, request: TableRequest, fs: FileSystemSpec) -> ToyTable:
        if not Path(str(request.table)).exists():
            raise FileNotFoundError(2, "No such file or directory")
        return super().open(request, fs)


class _KindWith(ToyTables):
    def __init__(self, table: type[ToyTable] = ToyTable, fmt: type[ToyFormat] = ToyFormat):
        self.table = table
        self._format = fmt

    def format(self) -> Format:
        return self._format()


@pytest.mark.parametrize(
    ("kind", "message"),
    [
        (_KindWith(table=_CountsDeletedRows), "live rows are|rows, expected|read .* rows, not"),
        (_KindWith(fmt=_ReadsDeletedRows), "rows, not|rows, expected"),
        (_KindWith(table=_VersionNotInDetails), "not among its fingerprint details"),
        (_Unpinned(), "missing version was planned without an error|plans to|still at"),
        (_ForeignErrors(), "not one of the library's errors"),
    ],
)
def test_the_suite_fails_broken_kinds(
    toy: tuple[Path, list[int]], kind: ToyTables, message: str
) -> None:
    root, live = toy
    with pytest.raises(AssertionError, match=message):
        check_table(
            kind,
            TableRequest(str(root)),
            id_column="id",
            expected=live,
            change=lambda: commit_toy(root, range(1000, 1050)),
            missing_version=99,
        )


def test_a_missing_toy_table_is_named(tmp_path: Path) -> None:
    register_table("toy", ToyTables)
    with pytest.raises(StorageNotFoundError, match="nothing-here"):
        plan_table(Source(str(tmp_path / "nothing-here"), format="toy"), FileSystemSpec("file"))


# --- Iceberg --------------------------------------------------------------------------------------

# Data files of 8, 2 and 1 row groups (100 rows each); deleted: row-group edges, a whole row
# group (300-399), the whole last file.
ICEBERG_PARTS = (range(0, 800), range(800, 950), range(950, 980))
ICEBERG_DELETES = {0: [0, 99, 100, *range(300, 400), 799], 800: [0, 149], 950: list(range(30))}


@pytest.fixture
def iceberg(tmp_path: Path) -> tuple[Any, list[int]]:
    """Table db.dels (ICEBERG_PARTS, ICEBERG_DELETES) in a fresh SQLite catalog; returns the
    catalog and the live ids."""
    pytest.importorskip("pyiceberg")
    from tests.iceberg import conftest as ice

    config = {
        "type": "sql",
        "uri": f"sqlite:///{tmp_path}/catalog.db",
        "warehouse": f"file://{tmp_path}/wh",
    }
    sql = ice.SqlCatalog(ice.CATALOG, uri=config["uri"], warehouse=config["warehouse"])
    sql.create_namespace(ice.NAMESPACE)
    catalog = ice.Catalog(sql, {"name": ice.CATALOG, **config}, tmp_path)
    table = catalog.create("dels", ICEBERG_PARTS)
    files = {
        pq.read_table(f.file_path.removeprefix("file://"), columns=["id"])["id"][0].as_py(): (
            f.file_path
        )
        for f in ice.data_files(table)
    }
    ice.commit_position_deletes(table, {files[k]: v for k, v in ICEBERG_DELETES.items()})
    gone = {first + p for first, positions in ICEBERG_DELETES.items() for p in positions}
    return catalog, [i for part in ICEBERG_PARTS for i in part if i not in gone]


def test_iceberg_conforms(iceberg: tuple[Any, list[int]]) -> None:
    catalog, live = iceberg
    from tests.iceberg.conftest import rows

    check_table(
        table_kind("iceberg"),
        TableRequest("db.dels", catalog=catalog.config),
        id_column="id",
        expected=live,
        change=lambda: catalog.load("dels").append(rows(range(5000, 5100))),
        missing_version=123,
    )


def test_iceberg_conforms_with_a_filter_and_a_tuple_name(iceberg: tuple[Any, list[int]]) -> None:
    catalog, live = iceberg
    request = TableRequest(("db", "dels"), catalog=catalog.config, filters="label = 2")
    expected = [i for i in live if i % 7 == 2]
    check_table(table_kind("iceberg"), request, id_column="id", expected=expected)
