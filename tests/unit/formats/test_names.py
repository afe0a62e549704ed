"""Unique column names (`formats.names`): the rule, by brute force over small name lists, and
CSV files whose header repeats a name or has empty ones, read under the new names."""

from __future__ import annotations

import itertools
import warnings
from pathlib import Path

import pyarrow as pa
import pytest

from torch_dataloader_utils.formats import Listing, ReadOptions
from torch_dataloader_utils.formats.names import RenamedColumnsWarning, renames, unique_names
from torch_dataloader_utils.formats.text import CsvFormat
from torch_dataloader_utils.fs import FileSystemSpec, list_files

FS = FileSystemSpec("file")


def test_rule_as_duckdb_names_them() -> None:
    names = ["a", "a", "", "", "a.1", "b", "a"]
    assert unique_names(names) == ("a", "a_1", "column2", "column3", "a.1", "b", "a_2")
    assert unique_names(["a", "a", "a_1"]) == ("a", "a_2", "a_1")  # a file's name is kept
    assert unique_names(["", "column0"]) == ("column0_1", "column0")
    assert unique_names(["x", "y"]) == ("x", "y")
    assert renames(["a", "a"]) == [(1, "a", "a_1")]


def test_rule_over_small_spaces_is_unique_stable_and_keeps_unique_names() -> None:
    alphabet = ["", "a", "a_1", "column0", "column1"]
    for n in range(1, 5):
        for names in itertools.product(alphabet, repeat=n):
            new = unique_names(names)
            assert len(set(new)) == n and all(new), names
            assert unique_names(new) == new, names  # unique names stay as they are
            for old, name in zip(names, new, strict=True):
                if old and names.count(old) == 1:
                    assert name == old, names  # a unique, non-empty name is kept


def _read(fmt: CsvFormat, path: Path, columns: tuple[str, ...] | None = None) -> pa.Table:
    files = list_files(str(path), FS)
    options = ReadOptions(columns=columns)
    plan = fmt.plan(Listing.of(files), FS, options)
    batches = [b for c in plan.chunks for b in fmt.read(c, 0, c.num_rows, FS, plan.read_options)]
    return pa.Table.from_batches(batches, schema=plan.schema)


@pytest.mark.parametrize("split_rows", [None, 2])
def test_csv_header_with_repeated_and_empty_names(tmp_path: Path, split_rows: int | None) -> None:
    path = tmp_path / "d.csv"
    rows = [(i, i * 10, f"s{i}", i / 2, i + 100) for i in range(5)]
    path.write_text("id,a,,,a\n" + "".join(",".join(map(str, r)) + "\n" for r in rows))
    fmt = CsvFormat()
    files = list_files(str(path), FS)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        plan = fmt.plan(Listing.of(files), FS, ReadOptions(split_rows=split_rows))
    told = [w for w in caught if issubclass(w.category, RenamedColumnsWarning)]
    assert len(told) == 1, [str(w.message) for w in caught]
    assert "d.csv" in str(told[0].message) and "'a' -> 'a_1'" in str(told[0].message)
    assert plan.schema.names == ["id", "a", "column2", "column3", "a_1"]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RenamedColumnsWarning)
        table = _read(fmt, path)
        assert table.to_pydict() == {
            "id": [r[0] for r in rows],
            "a": [r[1] for r in rows],
            "column2": [r[2] for r in rows],
            "column3": [r[3] for r in rows],
            "a_1": [r[4] for r in rows],
        }
        chosen = _read(fmt, path, ("a_1", "id"))
        assert chosen.to_pydict() == {"a_1": [r[4] for r in rows], "id": [r[0] for r in rows]}


def test_compressed_csv_with_repeated_names_reads_whole(tmp_path: Path) -> None:
    import gzip

    path = tmp_path / "d.csv.gz"
    path.write_bytes(gzip.compress(b"a,a\n1,2\n3,4\n"))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RenamedColumnsWarning)
        table = _read(CsvFormat(), path, ("a_1",))
    assert table.to_pydict() == {"a_1": [2, 4]}


def _binary(fmt_name: str, path: Path) -> pa.Table:
    import pyarrow.ipc as ipc
    import pyarrow.orc as orc

    table = pa.Table.from_arrays(
        [pa.array([1, 2, 3]), pa.array(["x", "y", "z"]), pa.array([0.5, 1.5, 2.5])],
        names=["a", "a", ""],
    )
    if fmt_name == "orc":
        orc.write_table(table, path)
    elif fmt_name == "ipc-file":
        with ipc.new_file(str(path), table.schema) as writer:
            writer.write_table(table)
    else:
        with ipc.new_stream(str(path), table.schema) as writer:
            writer.write_table(table)
    return table


@pytest.mark.parametrize("kind", ["orc", "ipc-file", "ipc-stream"])
def test_binary_formats_read_repeated_names_renamed(tmp_path: Path, kind: str) -> None:
    from torch_dataloader_utils.formats import get_format

    path = tmp_path / f"d.{kind}"
    _binary(kind, path)
    fmt = get_format(kind.split("-", maxsplit=1)[0])
    files = list_files(str(path), FS)
    for columns in (None, ("a_1", "column2"), ("a",)):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            options = ReadOptions(columns=columns)
            plan = fmt.plan(Listing.of(files), FS, options)
        told = [str(w.message) for w in caught if issubclass(w.category, RenamedColumnsWarning)]
        assert len(told) == 1 and f"d.{kind}" in told[0] and "'a' -> 'a_1'" in told[0], told
        assert fmt.schema(files[0], FS).names == ["a", "a_1", "column2"]
        read_options = plan.read_options or options
        batches = [b for c in plan.chunks for b in fmt.read(c, 0, c.num_rows, FS, read_options)]
        got = pa.Table.from_batches(batches).to_pydict()
        full = {"a": [1, 2, 3], "a_1": ["x", "y", "z"], "column2": [0.5, 1.5, 2.5]}
        assert got == {c: full[c] for c in (columns or full)}, (columns, got)
