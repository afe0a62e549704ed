"""``hive_partitions``: ``key=value`` directories become typed partition columns."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa

from torch_dataloader_utils.fs import FileSystemSpec, hive_partitions, list_files

LOCAL = FileSystemSpec("file")


def partitions(root: Path, *relative: str) -> tuple[pa.Schema, dict[str, dict[str, object]]]:
    """Create ``relative`` files under ``root``, list the directory, parse its partitions.

    Returns the schema and, per relative path, the partition values as a dict.
    """
    for rel in relative:
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(b"x")
    files = list_files(root, LOCAL)
    schema, values = hive_partitions(files)
    assert len(values) == len(files)
    by_file: dict[str, dict[str, object]] = {}
    for f, pairs in zip(files, values, strict=True):
        # Every file gets every key, in schema order.
        assert [k for k, _ in pairs] == schema.names
        by_file[str(Path(f.path).relative_to(root))] = dict(pairs)
    return schema, by_file


def test_integer_values_become_int64(tmp_path: Path) -> None:
    schema, values = partitions(
        tmp_path, "year=2023/m=1/a.bin", "year=2024/m=12/b.bin", "year=2024/m=-3/c.bin"
    )
    assert schema == pa.schema([("year", pa.int64()), ("m", pa.int64())])
    assert values == {
        "year=2023/m=1/a.bin": {"year": 2023, "m": 1},
        "year=2024/m=12/b.bin": {"year": 2024, "m": 12},
        "year=2024/m=-3/c.bin": {"year": 2024, "m": -3},
    }
    assert all(type(v) is int for row in values.values() for v in row.values())


def test_one_non_integer_value_makes_the_key_a_string(tmp_path: Path) -> None:
    schema, values = partitions(tmp_path, "k=1/a.bin", "k=2/b.bin", "k=2x/c.bin", "s=abc/d.bin")
    assert schema.field("k").type == pa.string()
    assert schema.field("s").type == pa.string()
    assert values["k=1/a.bin"]["k"] == "1"
    assert values["k=2x/c.bin"]["k"] == "2x"
    assert values["s=abc/d.bin"]["s"] == "abc"
    # Keys appear in order of first appearance over the sorted files.
    assert schema.names == ["k", "s"]


def test_hive_default_partition_is_null(tmp_path: Path) -> None:
    schema, values = partitions(
        tmp_path,
        "k=__HIVE_DEFAULT_PARTITION__/a.bin",
        "k=7/b.bin",
        "s=__HIVE_DEFAULT_PARTITION__/c.bin",
    )
    # The null does not stop the other values from being integers.
    assert schema.field("k").type == pa.int64()
    assert values["k=__HIVE_DEFAULT_PARTITION__/a.bin"]["k"] is None
    assert values["k=7/b.bin"]["k"] == 7
    # A key whose values are all null is a string column of nulls.
    assert schema.field("s").type == pa.string()
    assert values["s=__HIVE_DEFAULT_PARTITION__/c.bin"]["s"] is None


def test_url_quoted_values_and_keys_are_unquoted(tmp_path: Path) -> None:
    schema, values = partitions(
        tmp_path, "city=New%20York/a.bin", "city=a%2Fb%3Dc/b.bin", "my%20key=1/c.bin"
    )
    assert schema.names == ["city", "my key"]
    assert values["city=New%20York/a.bin"]["city"] == "New York"
    assert values["city=a%2Fb%3Dc/b.bin"]["city"] == "a/b=c"
    assert values["my%20key=1/c.bin"]["my key"] == 1


def test_keys_missing_under_some_files_are_null(tmp_path: Path) -> None:
    schema, values = partitions(tmp_path, "a=1/b=x/f1.bin", "a=2/f2.bin", "f3.bin", "b=y/f4.bin")
    assert schema == pa.schema([("a", pa.int64()), ("b", pa.string())])
    assert values == {
        "a=1/b=x/f1.bin": {"a": 1, "b": "x"},
        "a=2/f2.bin": {"a": 2, "b": None},
        "f3.bin": {"a": None, "b": None},
        "b=y/f4.bin": {"a": None, "b": "y"},
    }


def test_directories_without_equals_are_not_partitions(tmp_path: Path) -> None:
    schema, values = partitions(tmp_path, "plain/k=1/a.bin", "=v/b.bin", "plain/k=2/c.bin")
    assert schema.names == ["k"]
    assert values["=v/b.bin"] == {"k": None}


def test_no_partitions_gives_an_empty_schema(tmp_path: Path) -> None:
    schema, values = partitions(tmp_path, "a.bin", "sub/b.bin")
    assert len(schema) == 0
    assert values == {"a.bin": {}, "sub/b.bin": {}}


def test_partitions_are_read_below_the_listed_directory_only(tmp_path: Path) -> None:
    # ``k=1`` is above the listed root: it is part of where the data lives, not a partition.
    schema, values = partitions(tmp_path / "k=1" / "root", "j=2/a.bin")
    assert schema.names == ["j"]
    assert values == {"j=2/a.bin": {"j": 2}}


def test_glob_partitions_start_at_the_first_wildcard(tmp_path: Path) -> None:
    for rel in ["t/k=1/a.bin", "t/k=2/b.bin"]:
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_bytes(b"x")
    files = list_files(str(tmp_path / "t" / "k=*" / "*.bin"), LOCAL)
    schema, values = hive_partitions(files)
    assert schema == pa.schema([("k", pa.int64())])
    assert values == [(("k", 1),), (("k", 2),)]
