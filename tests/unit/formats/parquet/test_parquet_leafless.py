"""Parquet columns with no leaf columns (`formats.parquet.leafless`): read as the nulls
``pq.read_table`` gives, in their place, locally and remotely, whatever the projection; a column
with an empty struct beside leaf columns (which pyarrow cannot read) refused at planning."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import fsspec
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import torch_dataloader_utils as tdu
from tests.corpus.writers import ROWS, files
from torch_dataloader_utils.errors import UnsupportedFileError
from torch_dataloader_utils.formats import FormatPlan, Listing, ReadOptions
from torch_dataloader_utils.formats.parquet import ParquetFormat
from torch_dataloader_utils.formats.parquet.leafless import ParquetReadOptions
from torch_dataloader_utils.fs import FileSystemSpec, ListedFile, list_files

LEAFLESS = ("empty", "nested_empty", "list_of_empty")


def _write(tmp_path: Path, name: str) -> Path:
    (written,) = [w for w in files() if w.name == name]
    path = tmp_path / f"{name}.parquet"
    written.write(path)
    return path


@pytest.fixture
def leafless(tmp_path: Path) -> Path:
    """id, empty: struct<>, nested_empty: struct<inner: struct<>>, list_of_empty:
    list<struct<>>, value: double; 300 rows in row groups of 120."""
    return _write(tmp_path, "pyarrow-empty-structs")


def _plan(
    paths: list[str], fs: FileSystemSpec, options: ReadOptions
) -> tuple[FormatPlan, list[ListedFile]]:
    found = list_files(paths, fs)
    return ParquetFormat().plan(Listing.of(found), fs, options), found


def _read_all(plan: FormatPlan, fs: FileSystemSpec, options: ReadOptions) -> pa.Table:
    fmt = ParquetFormat()
    read_with = plan.read_options or options
    try:
        batches = []
        for chunk in plan.chunks:
            # in two pieces, the second starting inside the chunk: put back batch by batch
            cut = chunk.num_rows // 3
            batches += fmt.read(chunk, 0, cut, fs, read_with)
            batches += fmt.read(chunk, cut, chunk.num_rows, fs, read_with)
    finally:
        fmt.close()
    return pa.Table.from_batches(batches, schema=plan.schema)


@pytest.mark.parametrize("columns", [None, ("list_of_empty", "id", "empty"), ("empty",)])
def test_a_column_without_leaves_reads_as_pyarrows_nulls_in_its_place(
    leafless: Path, columns: tuple[str, ...] | None
) -> None:
    fs = FileSystemSpec("file")
    options = ReadOptions(columns=columns)
    plan, _ = _plan([str(leafless)], fs, options)
    assert isinstance(plan.read_options, ParquetReadOptions)
    got = _read_all(plan, fs, options)
    expected = pq.read_table(leafless, columns=list(columns) if columns else None)
    assert got.schema.names == expected.schema.names
    assert got.to_pylist() == expected.to_pylist()
    for name in LEAFLESS:
        if name in got.schema.names:
            assert got.column(name).null_count == ROWS
            assert got.schema.field(name).type == expected.schema.field(name).type
    if columns is None:
        assert got.column("id").to_pylist() == list(range(ROWS))


def test_columns_with_leaves_read_as_before(leafless: Path) -> None:
    fs = FileSystemSpec("file")
    options = ReadOptions(columns=("value", "id"))
    plan, _ = _plan([str(leafless)], fs, options)
    assert plan.read_options is None  # nothing to put back: the plain read
    got = _read_all(plan, fs, options)
    assert got.to_pylist() == pq.read_table(leafless, columns=["value", "id"]).to_pylist()


@pytest.fixture
def remote(leafless: Path) -> Iterator[str]:
    path = f"/tdu-leafless-{uuid.uuid4().hex}/f.parquet"
    fsspec.filesystem("memory").pipe(path, leafless.read_bytes())
    yield f"memory://{path}"
    fsspec.filesystem("memory").rm(path)


def test_a_remote_read_puts_them_back_too(leafless: Path, remote: str) -> None:
    fs = FileSystemSpec("memory")
    plan, _ = _plan([remote], fs, ReadOptions())
    got = _read_all(plan, fs, ReadOptions())
    assert got.to_pylist() == pq.read_table(leafless).to_pylist()


def test_a_column_with_an_empty_struct_beside_leaves_is_refused_at_planning(
    tmp_path: Path,
) -> None:
    path = _write(tmp_path, "pyarrow-empty-struct-beside-leaves")
    with pytest.raises(Exception, match="non-leaf node has no children"):
        pq.read_table(path)  # pyarrow cannot read it either
    fs = FileSystemSpec("file")
    with pytest.raises(UnsupportedFileError) as caught:
        _plan([str(path)], fs, ReadOptions())
    message = str(caught.value)
    assert str(path) in message and "'partly_empty'" in message and "partly_empty.inner" in message
    # Left out, the file's other columns read.
    options = ReadOptions(columns=("id",))
    plan, _ = _plan([str(path)], fs, options)
    assert _read_all(plan, fs, options).column("id").to_pylist() == list(range(ROWS))


@pytest.mark.parametrize("output", ["arrow", "torch"])
def test_the_loader_delivers_every_column_and_row(leafless: Path, output: str) -> None:
    loader = tdu.create_dataloader(
        str(leafless), format="parquet", batch_size=64, shuffle=True, output_format=output
    )
    ids: list[int] = []
    for batch in loader:
        names = batch.schema.names if output == "arrow" else list(batch)
        assert [n for n in names if n in (*LEAFLESS, "id", "value")] == [
            "id",
            *LEAFLESS,
            "value",
        ]
        for name in LEAFLESS:
            values = batch.column(name).to_pylist() if output == "arrow" else list(batch[name])
            assert values == [None] * len(values)
        ids += batch.column("id").to_pylist() if output == "arrow" else batch["id"].tolist()
    assert sorted(ids) == list(range(ROWS))


@pytest.mark.parametrize("large", [False, True])
def test_a_list_view_of_a_struct_or_map_counts_its_leaves(tmp_path: Path, large: bool) -> None:
    """A list view (read back from the file's Arrow schema) is stored as a list: its values'
    leaves are its leaf columns; it was refused as a footer with more column chunks than the
    schema's leaves."""
    view = pa.large_list_view if large else pa.list_view
    item = pa.struct([("a", pa.int64()), ("m", pa.map_(pa.string(), pa.int32()))])
    rows = [[{"a": i, "m": [("k", i)]}] * (i % 3) for i in range(40)]
    table = pa.table({"id": pa.array(range(40)), "v": pa.array(rows, view(item))})
    pq.write_table(table, tmp_path / "views.parquet", row_group_size=16)
    loader = tdu.create_dataloader(str(tmp_path), batch_size=7, output_format="arrow")
    got = pa.concat_tables(pa.Table.from_batches([b]) for b in loader)
    assert sorted(got["id"].to_pylist()) == list(range(40))
    assert got.sort_by("id")["v"].to_pylist() == table["v"].to_pylist()
