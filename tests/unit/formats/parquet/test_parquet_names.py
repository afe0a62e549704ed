"""Parquet files whose columns repeat a name or have none (`formats.names`): planned and read
under the unique names, locally and remotely, whole or in pieces, through the loader too; every
value compared with ``pq.ParquetFile(path).read()`` renamed by the same rule (``pq.read_table``
refuses such files: "Multiple matches for FieldRef.Name(a)")."""

from __future__ import annotations

import uuid
import warnings
from collections.abc import Iterator
from pathlib import Path

import fsspec
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

import torch_dataloader_utils as tdu
from torch_dataloader_utils.errors import UnsupportedFileError
from torch_dataloader_utils.formats import FormatPlan, Listing, ReadOptions
from torch_dataloader_utils.formats.names import RenamedColumnsWarning, unique_names
from torch_dataloader_utils.formats.parquet import ParquetFormat
from torch_dataloader_utils.formats.parquet import format as parquet_module
from torch_dataloader_utils.formats.parquet import renaming as parquet_names
from torch_dataloader_utils.formats.parquet.facts import chunk_ranges
from torch_dataloader_utils.fs import FileSystemSpec, list_files

ROWS = 1000
NAMES = ["id", "a", "a", ""]
UNIQUE = ["id", "a", "a_1", "column3"]


@pytest.fixture
def local(tmp_path: Path) -> Path:
    """``id, a, a, ""``: 1,000 rows in row groups of 128; every column's values differ."""
    ids = np.arange(ROWS, dtype=np.int64)
    table = pa.Table.from_arrays(
        [pa.array(ids), pa.array(ids * 10), pa.array(ids / 4), pa.array((ids % 7).astype("i4"))],
        names=NAMES,
    )
    path = tmp_path / "dup.parquet"
    pq.write_table(table, path, row_group_size=128)
    return path


@pytest.fixture
def remote(local: Path) -> Iterator[str]:
    path = f"/tdu-names-{uuid.uuid4().hex}/dup.parquet"
    fsspec.filesystem("memory").pipe(path, local.read_bytes())
    yield f"memory://{path}"
    fsspec.filesystem("memory").rm(path)


def _reference(path: Path) -> pa.Table:
    with pytest.raises(pa.ArrowInvalid, match="Multiple matches"):
        pq.read_table(path)  # the dataset API cannot read such a file at all
    table = pq.ParquetFile(path).read()
    assert table.schema.names == NAMES
    return table.rename_columns(list(unique_names(table.schema.names)))


def _plan_quietly(
    fmt: ParquetFormat, where: str, fs: FileSystemSpec, options: ReadOptions
) -> tuple[FormatPlan, list[str]]:
    files = list_files(where, fs)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        plan = fmt.plan(Listing.of(files), fs, options)
    told = [str(w.message) for w in caught if issubclass(w.category, RenamedColumnsWarning)]
    return plan, told


def _read(where: str, fs: FileSystemSpec, options: ReadOptions) -> pa.Table:
    """Every chunk read in three pieces (the first a few head rows, the second starting inside
    a row group), the next piece prefetched before each read as the stream does."""
    fmt = ParquetFormat()
    try:
        plan, told = _plan_quietly(fmt, where, fs, options)
        assert len(told) == 1, told
        assert "dup.parquet" in told[0] and "'a' -> 'a_1'" in told[0] and "'column3'" in told[0]
        read_with = plan.read_options or options
        batches = []
        for chunk in plan.chunks:
            n = chunk.num_rows
            for lo, hi in ((0, 5), (5, n // 2 + 3), (n // 2 + 3, n)):
                fmt.prefetch(chunk, lo, hi, fs, read_with)
                batches += fmt.read(chunk, lo, hi, fs, read_with)
        return pa.Table.from_batches(batches, schema=plan.schema)
    finally:
        fmt.close()


COLUMNS = [None, ("a_1",), ("column3", "a"), ("id",), ("a", "id", "a_1"), ()]


@pytest.mark.parametrize("split_rows", [None, 300])
@pytest.mark.parametrize("columns", COLUMNS)
def test_a_local_file_reads_under_the_unique_names(
    local: Path, columns: tuple[str, ...] | None, split_rows: int | None
) -> None:
    want = _reference(local)
    got = _read(str(local), FileSystemSpec("file"), ReadOptions(columns, split_rows=split_rows))
    names = list(columns) if columns is not None else UNIQUE
    assert got.schema.names == names
    assert got.num_rows == ROWS
    assert got.to_pydict() == want.select(names).to_pydict()


@pytest.mark.parametrize("mode", ["fetched", "streamed"])
@pytest.mark.parametrize("columns", COLUMNS[:3])
def test_a_remote_file_reads_under_the_unique_names(
    local: Path,
    remote: str,
    columns: tuple[str, ...] | None,
    mode: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    if mode == "streamed":  # too big to fetch whole: pyarrow reads the pages through ranges
        monkeypatch.setattr(parquet_module, "_FETCH_BYTES", 0)
    got = _read(remote, FileSystemSpec("memory"), ReadOptions(columns, split_rows=300))
    names = list(columns) if columns is not None else UNIQUE
    assert got.to_pydict() == _reference(local).select(names).to_pydict()


def test_a_remote_fetch_takes_every_column_of_the_names_asked(remote: str) -> None:
    fs = FileSystemSpec("memory")
    (file,) = list_files(remote, fs)
    fmt = ParquetFormat()
    found = fmt._footer(file.path, fs)
    asked = parquet_names.asked(found.renaming, ("a_1", "id"))
    assert asked == ["a", "id"]  # pyarrow gives both columns named a: both are fetched
    assert len(chunk_ranges(found.metadata, found.footer, 0, asked)) == 3
    assert parquet_names.asked(found.renaming, None) is None


def test_the_schema_and_planning_use_the_unique_names(local: Path) -> None:
    fs = FileSystemSpec("file")
    (file,) = list_files(str(local), fs)
    assert ParquetFormat().schema(file, fs).names == UNIQUE
    plan, told = _plan_quietly(ParquetFormat(), str(local), fs, ReadOptions(("a_1",)))
    assert plan.schema.names == ["a_1"]
    assert plan.schema.field("a_1").type == pa.float64()
    assert told == [
        f"{local}: columns repeat a name or have none; read as: #2 'a' -> 'a_1', "
        "#3 '' -> 'column3' (columns= and filters use the new names)"
    ]


def test_files_with_unique_names_pay_nothing(tmp_path: Path) -> None:
    path = tmp_path / "plain.parquet"
    pq.write_table(pa.table({"id": [1, 2], "a": [3, 4]}), path)
    fs = FileSystemSpec("file")
    fmt = ParquetFormat()
    plan, told = _plan_quietly(fmt, str(path), fs, ReadOptions())
    assert told == []
    (chunk,) = plan.chunks
    (batch,) = fmt.read(chunk, 0, 2, fs, ReadOptions())
    assert batch.to_pydict() == {"id": [1, 2], "a": [3, 4]}
    assert fmt._file(str(path), fs)[1] is None  # no renaming: batches as pyarrow gives them


@pytest.mark.parametrize(
    ("workers", "output"), [(0, "arrow"), (0, "torch"), (2, "arrow"), (2, "torch")]
)
def test_the_loader_delivers_every_row_once_under_the_unique_names(
    local: Path, workers: int, output: str
) -> None:
    want = _reference(local).to_pydict()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        loader = tdu.create_dataloader(
            str(local),
            format="parquet",
            batch_size=64,
            shuffle=True,
            split_rows=200,
            num_workers=workers,
            multiprocessing_context="fork" if workers else None,
            output_format=output,
        )
        rows: dict[int, tuple[object, ...]] = {}
        for batch in loader:
            if output == "arrow":
                assert batch.schema.names == UNIQUE
                values = [batch.column(n).to_pylist() for n in UNIQUE]
            else:
                assert list(batch) == UNIQUE
                values = [batch[n].tolist() for n in UNIQUE]
            for row in zip(*values, strict=True):
                assert row[0] not in rows, f"id {row[0]} delivered twice"
                rows[row[0]] = row
    told = [str(w.message) for w in caught if issubclass(w.category, RenamedColumnsWarning)]
    assert len(told) == 1 and str(local) in told[0], told
    assert sorted(rows) == want["id"]
    for i, row in rows.items():
        assert row == tuple(want[n][i] for n in UNIQUE)


@pytest.mark.parametrize(
    "expr",
    [
        pc.field("a_1") >= 200.0,  # a renamed column
        pc.field("a") < 3000,  # a repeated name's first column: pyarrow's dataset cannot bind it
        (pc.field("column3") == 2) & (pc.field("id") >= 500),
    ],
)
def test_a_filter_on_the_unique_names_selects_the_rows(local: Path, expr: pc.Expression) -> None:
    want = _reference(local)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RenamedColumnsWarning)
        loader = tdu.create_dataloader(
            str(local),
            format="parquet",
            batch_size=100,
            filters=expr,
            columns=["id", "a_1"],
            output_format="arrow",
        )
        got = pa.Table.from_batches(list(loader))
    expected = want.filter(expr).select(["id", "a_1"])
    assert got.num_rows == expected.num_rows > 0
    assert got.sort_by("id").to_pydict() == expected.to_pydict()


def test_struct_fields_that_repeat_a_name_are_still_refused(tmp_path: Path) -> None:
    path = tmp_path / "struct.parquet"
    kind = pa.struct([("x", pa.int64()), ("x", pa.int64())])
    values = pa.StructArray.from_arrays([pa.array([1]), pa.array([2])], fields=list(kind))
    pq.write_table(pa.table({"s": values}), path)
    with pytest.raises(UnsupportedFileError, match="two fields named 'x'"):
        tdu.create_dataloader(str(path), format="parquet")
