"""Delta tables that other engines wrote (Databricks Runtime, Apache Spark; copied from delta-rs'
test data, see ``tests/delta/data/NOTICE.md``), read at EVERY version through
``tdu.create_dataloader(path, format="delta", version=v)`` and compared whole row by whole row
with deltalake's own reading (DataFusion: deletion vectors and column mapping applied; its
pyarrow dataset for INT96 timestamps), our decoded deletion vectors position by position with
deltalake's; also with DataLoader workers; and known values the logs and data files state.

What they hold that our hand-written tables do not: Databricks' deletion vector files, replaced
from version to version (DELETE, UPDATE, MERGE, OPTIMIZE), and read from a Parquet checkpoint;
column mapping with names that have spaces; a partition column renamed under column mapping;
Spark's INT96 timestamps past 2262.
"""

from __future__ import annotations

import shutil
from collections import Counter
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlparse

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds
import pytest

import torch_dataloader_utils as tdu
from torch_dataloader_utils.fs import FileSystemSpec
from torch_dataloader_utils.sources.table_kinds import table_kind
from torch_dataloader_utils.sources.tables import TableRequest, VersionSelector

deltalake = pytest.importorskip("deltalake")
pytestmark = [
    pytest.mark.timeout(120),
    pytest.mark.filterwarnings("ignore:This DataLoader will create:UserWarning"),
]
DATA = Path(__file__).parent / "data"
FS = FileSystemSpec("file")
# Table -> (its latest version, whether it has deletion vectors).
TABLES = {
    "table-with-dv-small": (1, True),
    "table-without-dv-small": (0, False),
    "table_with_column_mapping": (0, False),
    "table_with_partitioning_mapping": (4, False),
    "cdf-table-with-cdc-and-dvs": (25, True),
    "table_with_deletion_logs": (20, True),
    "table_with_edge_timestamps": (0, False),
}
# deltalake's DataFusion reader decodes Spark's INT96 timestamps in nanoseconds, which overflow
# past 2262 (delta-rs' own test pins 1816-03-29 for 9999-12-31): its pyarrow dataset reads them
# in microseconds, as delta-rs' Python test does.
INT96 = "table_with_edge_timestamps"


@pytest.fixture(scope="module")
def tables(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A copy of the tables (the tests never write into the repository)."""
    root = tmp_path_factory.mktemp("interop")
    for name in TABLES:
        shutil.copytree(DATA / name, root / name)
    return root


def _ours(path: Path, version: int | None = None, **options: Any) -> pa.Table:
    """Every row our loader reads (as Arrow)."""
    options.setdefault("batch_size", 3)  # batches that cut across files and row groups
    options.setdefault("num_workers", 0)
    if options["num_workers"]:
        options.update(multiprocessing_context="fork", timeout=60)
    loader = tdu.create_dataloader(
        str(path), format="delta", version=version, output_format="arrow", **options
    )
    batches = [pa.table(b) for b in loader]
    return pa.concat_tables(batches) if batches else loader.dataset.plan.schema.empty_table()


def _theirs(path: Path, version: int | None = None) -> pa.Table:
    """deltalake's reading of the version."""
    table = deltalake.DeltaTable(str(path), version=version)
    if path.name == INT96:
        options = ds.ParquetReadOptions(coerce_int96_timestamp_unit="us")
        return table.to_pyarrow_dataset(parquet_read_options=options).to_table()
    return pa.table(deltalake.QueryBuilder().register("t", table).execute("select * from t"))


def _rows(table: pa.Table, names: list[str]) -> list[tuple[Any, ...]]:
    """Whole rows (``names``' values) in a canonical order: equal lists are equal multisets."""
    rows = table.select(names).to_pylist()
    return sorted((tuple(r[n] for n in names) for r in rows), key=repr)


def _same_rows(ours: pa.Table, theirs: pa.Table, where: str) -> None:
    names = theirs.column_names
    assert ours.column_names == names, where
    assert _rows(ours, names) == _rows(theirs, names), where


def _same_types(ours: pa.Table, path: Path, version: int | None, where: str) -> None:
    """Our batches' types are the table's (deltalake's schema; DataFusion's answer has views)."""
    schema = deltalake.DeltaTable(str(path), version=version).schema()
    for field in pa.schema(schema.to_arrow()):
        assert ours.schema.field(field.name).type == field.type, f"{where}: {field.name}"


@pytest.mark.parametrize("name", list(TABLES))
def test_every_version_reads_the_rows_deltalake_reads(tables: Path, name: str) -> None:
    path = tables / name
    latest, _ = TABLES[name]
    assert deltalake.DeltaTable(str(path)).version() == latest
    for version in range(latest + 1):
        ours, where = _ours(path, version), f"{name} at version {version}"
        _same_rows(ours, _theirs(path, version), where)
        _same_types(ours, path, version, where)
    _same_rows(_ours(path), _theirs(path), f"{name} (latest)")


def _our_deleted(path: Path, version: int) -> dict[str, list[int]]:
    """Our decoded deleted positions of each data file of the version (files with some)."""
    opened = table_kind("delta").open(
        TableRequest(str(path), version=VersionSelector(version=version)), FS
    )
    files = opened.files(tuple(opened.schema.arrow.names), FS)
    return {f.path: f.deleted.tolist() for f in files if len(f.deleted)}


def _their_deleted(path: Path, version: int) -> dict[str, list[int]]:
    """deltalake's: its selection vectors' ``False`` positions (rows past the end are kept)."""
    table = deltalake.DeltaTable(str(path), version=version)
    found = pa.table(table.deletion_vectors()).to_pylist()
    out = {}
    for row in found:
        deleted = [i for i, keep in enumerate(row["selection_vector"]) if not keep]
        if deleted:
            out[unquote(urlparse(row["filepath"]).path)] = deleted
    return out


@pytest.mark.parametrize("name", [n for n, (_, dvs) in TABLES.items() if dvs])
def test_deletion_vectors_decode_to_deltalakes_positions(tables: Path, name: str) -> None:
    path = tables / name
    latest, _ = TABLES[name]
    with_deletes = 0
    for version in range(latest + 1):
        ours = _our_deleted(path, version)
        assert ours == _their_deleted(path, version), f"{name} at version {version}"
        with_deletes += bool(ours)
    assert with_deletes  # (some version has deleted rows)


def test_databricks_deletes_are_gone(tables: Path) -> None:
    """Known values: the DELETE of values 0 and 9 (an on-disk vector), and the same rows without
    deletion vectors written by Spark."""
    dv = tables / "table-with-dv-small"
    assert sorted(_ours(dv, 0).column("value").to_pylist()) == list(range(10))
    assert sorted(_ours(dv, 1).column("value").to_pylist()) == list(range(1, 9))
    assert sorted(_ours(dv).column("value").to_pylist()) == list(range(1, 9))
    assert _our_deleted(dv, 1) == {str(next(dv.glob("part-*.parquet"))): [0, 9]}
    plain = tables / "table-without-dv-small"
    assert sorted(_ours(plain).column("value").to_pylist()) == list(range(10))
    spark = deltalake.DeltaTable(str(plain)).to_pyarrow_table()  # its pyarrow reader too
    _same_rows(_ours(plain), spark, "table-without-dv-small (to_pyarrow_table)")
    logs = tables / "table_with_deletion_logs"  # version 3: DELETE id = 12; 4: id = 89
    ids = [_ours(logs, v).column("id").to_pylist() for v in (2, 3, 4, 20)]
    assert 12 in ids[0] and 89 in ids[0] and len(ids[0]) == 100
    assert 12 not in ids[1] and 89 in ids[1] and len(ids[1]) == 99
    assert 12 not in ids[2] and 89 not in ids[2] and len(ids[2]) == 98
    assert sorted(ids[3]) == sorted(ids[2])  # (later UPDATEs move no rows out)


def test_mapped_names_and_a_renamed_partition_column(tables: Path) -> None:
    """Known values under column mapping: names with spaces (deltalake's ``to_pyarrow_table``
    reads the mapped data column as nulls: our values are the files' own), a projection and a
    filter on them; a partition column renamed (``id`` -> ``newid``) after files were written."""
    mapped = tables / "table_with_column_mapping"
    got = _ours(mapped)
    assert Counter(zip(*got.to_pydict().values(), strict=True)) == Counter(
        [
            ("BMS", "Mr. Daniel Ferguson MD"),
            ("BMS", "Stephanie Mcgrath"),
            ("BMS", "Anthony Johnson"),
            ("BMS", "Nathan Bennett"),
            ("BME", "Timothy Lamb"),
        ]
    )
    picked = _ours(mapped, columns=["Super Name"], filters=pc.field("Company Very Short") == "BME")
    assert picked.to_pydict() == {"Super Name": ["Timothy Lamb"]}
    renamed = tables / "table_with_partitioning_mapping"
    assert _ours(renamed, 2).column_names == ["id", "description"]
    assert _ours(renamed, 3).column_names == ["newid", "description"]
    assert sorted(_ours(renamed).column("newid").to_pylist()) == [1, 2]
    only = _ours(renamed, filters=pc.field("newid") == 2)
    assert only.to_pylist() == [{"newid": 2, "description": "Additional data"}]


def test_spark_int96_timestamps_past_2262(tables: Path) -> None:
    """Spark's INT96 timestamps are read in Delta's microseconds: 9999-12-31, as the log's
    statistics say, not a nanosecond overflow (1816-03-29, or a refused cast)."""
    got = _ours(tables / INT96).sort_by("SOME_VALUE").to_pydict()
    assert got["BIG_DATE"] == [
        datetime(9999, 12, 31, tzinfo=UTC),
        datetime(9999, 12, 30, tzinfo=UTC),
    ]
    assert got["NORMAL_DATE"] == [
        datetime(2022, 1, 1, tzinfo=UTC),
        datetime(2022, 2, 1, tzinfo=UTC),
    ]
    late = _ours(tables / INT96, filters=pc.field("BIG_DATE") > datetime(9999, 12, 30, tzinfo=UTC))
    assert late.column("SOME_VALUE").to_pylist() == [1]


def test_worker_processes_read_the_same_rows(tables: Path) -> None:
    for name, (latest, _) in TABLES.items():
        path = tables / name
        for version in sorted({latest, latest // 2}):
            ours = _ours(path, version, num_workers=2, shuffle=True)
            _same_rows(ours, _theirs(path, version), f"{name} at version {version}, 2 workers")
