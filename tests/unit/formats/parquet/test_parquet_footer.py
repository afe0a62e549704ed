"""The footer walk planning does per Parquet file (`formats.parquet.footer`) and the Arrow schema
worked out once per distinct footer schema (`formats.parquet.facts`)."""

from __future__ import annotations

import datetime
import decimal
import random
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.parquet as pq
import pytest

from torch_dataloader_utils.errors import CorruptFileError, UnsupportedFileError
from torch_dataloader_utils.formats import ReadOptions
from torch_dataloader_utils.formats.parquet import facts as parquet_facts
from torch_dataloader_utils.formats.parquet.facts import read_facts
from torch_dataloader_utils.formats.parquet.footer import (
    MAGIC,
    Footer,
    parse_footer,
    read_tail,
)
from torch_dataloader_utils.fs import FileSystemSpec, ListedFile


def _tables() -> dict[str, pa.Table]:
    n = 300
    ids = np.arange(n)
    return {
        "flat": pa.table({"id": ids, "x": ids.astype(np.float32), "s": [f"v{i % 7}" for i in ids]}),
        "nested": pa.table(
            {
                "id": ids,
                "l": [[i, i + 1] for i in range(n)],
                "st": [{"a": i, "b": str(i)} for i in range(n)],
                "m": pa.array([[("k", i)] for i in range(n)], pa.map_(pa.string(), pa.int64())),
            }
        ),
        "types": pa.table(
            {
                "ts": pa.array(
                    [
                        datetime.datetime(2024, 1, 1) + datetime.timedelta(seconds=i)
                        for i in range(n)
                    ],
                    pa.timestamp("ms", tz="UTC"),
                ),
                "d": pa.array([decimal.Decimal(i) / 100 for i in range(n)], pa.decimal128(10, 2)),
                "dict": pa.array([f"c{i % 3}" for i in ids]).dictionary_encode(),
                "big": pa.array([str(i) for i in ids], pa.large_string()),
                "b": pa.array([i % 2 == 0 for i in ids]),
                "nulls": pa.array([None] * n, pa.int32()),
            }
        ),
    }


@pytest.fixture(scope="module")
def written(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    root = tmp_path_factory.mktemp("footers")
    paths = []
    for name, table in _tables().items():
        for compression, group in (("snappy", 64), ("none", 1000), ("zstd", 7)):
            path = root / f"{name}-{compression}-{group}.parquet"
            pq.write_table(table, path, compression=compression, row_group_size=group)
            paths.append(path)
    path = root / "no-stats.parquet"
    pq.write_table(_tables()["flat"], path, write_statistics=False, use_dictionary=False)
    paths.append(path)
    return paths


def _footer(path: Path) -> tuple[bytes, int]:
    with pa.OSFile(str(path)) as source:
        size = source.size()
        thrift, _ = read_tail(source, size, str(path))
    return thrift, size


def test_the_walk_agrees_with_pyarrow_on_every_count_size_and_offset(written: list[Path]) -> None:
    for path in written:
        thrift, size = _footer(path)
        footer = parse_footer(thrift, str(path), size)
        meta = pq.read_metadata(path)
        assert footer.num_rows == meta.num_rows
        assert len(footer.row_groups) == meta.num_row_groups
        for i, (rows, columns) in enumerate(footer.row_groups):
            group = meta.row_group(i)
            assert rows == group.num_rows
            assert len(columns) == group.num_columns
            for j, column in enumerate(columns):
                expected = group.column(j)
                start = expected.data_page_offset
                if expected.has_dictionary_page and 0 < expected.dictionary_page_offset < start:
                    start = expected.dictionary_page_offset
                assert column.start == start, (path, i, j)
                assert column.compressed == expected.total_compressed_size
                assert column.uncompressed == expected.total_uncompressed_size


def test_the_schema_worked_out_once_is_the_one_pyarrow_reads(written: list[Path]) -> None:
    fs = FileSystemSpec("file")
    for path in written:
        facts = read_facts(ListedFile(str(path), path.stat().st_size, ""), (), fs, ReadOptions())
        expected = ds.ParquetFileFormat().make_fragment(pa.OSFile(str(path))).physical_schema
        assert facts.schema.equals(expected), path
        assert facts.schema.equals(pq.read_schema(path)), path


def test_files_with_one_schema_share_it_and_files_with_other_metadata_do_not(
    tmp_path: Path,
) -> None:
    table = _tables()["flat"]
    for i in range(3):  # other rows, other row groups, the same schema
        pq.write_table(table.slice(0, 10 * (i + 1)), tmp_path / f"a{i}.parquet", row_group_size=7)
    stamped = table.replace_schema_metadata({"writer": "someone else"})
    pq.write_table(stamped, tmp_path / "b.parquet")
    fs = FileSystemSpec("file")
    paths = sorted(tmp_path.glob("*.parquet"))
    facts = [
        read_facts(ListedFile(str(p), p.stat().st_size, ""), (), fs, ReadOptions()) for p in paths
    ]
    assert facts[0].schema is facts[1].schema is facts[2].schema
    assert facts[3].schema is not facts[0].schema
    assert facts[3].schema.metadata == {b"writer": b"someone else"}
    assert [sum(rg[1] for rg in f.row_groups) for f in facts] == [10, 20, 30, len(table)]


def test_the_rest_of_a_footer_leaves_out_its_rows_and_row_groups(written: list[Path]) -> None:
    thrift, size = _footer(written[0])
    footer = parse_footer(thrift, "x", size)
    rest = b"".join(footer.rest)
    assert len(rest) < len(thrift)
    assert b"ARROW:schema" in rest  # the key-value metadata stays
    # The walk ends at the footer's end: nothing is left out after the row groups' values.
    assert thrift.endswith(footer.rest[-1])


def _mutations(thrift: bytes, seed: int, count: int) -> list[bytes]:
    rng = random.Random(seed)
    found = []
    for _ in range(count):
        data = bytearray(thrift)
        for _ in range(rng.randint(1, 4)):
            data[rng.randrange(len(data))] = rng.choice([0x00, 0x0F, 0x19, 0x1C, 0x7F, 0x80, 0xFF])
        if rng.random() < 0.2:
            data = data[: rng.randrange(len(data))]
        found.append(bytes(data))
    return found


def test_a_mutated_footer_parses_or_is_a_clear_error_quickly(written: list[Path]) -> None:
    for k, path in enumerate(written[:6]):
        thrift, size = _footer(path)
        for data in _mutations(thrift, seed=k, count=300):
            start = time.monotonic()
            try:
                footer = parse_footer(data, "f.parquet", size)
            except (CorruptFileError, UnsupportedFileError) as exc:
                assert "f.parquet" in str(exc)
            else:
                assert isinstance(footer, Footer)
            assert time.monotonic() - start < 1.0


def _field(delta: int, kind: int) -> bytes:
    return bytes([delta << 4 | kind])


@pytest.mark.parametrize("element", [3, 7, 1])  # bytes, doubles, booleans
def test_a_list_claiming_more_elements_than_bytes_is_corrupt_not_a_hang(element: int) -> None:
    # FileMetaData { 1: i32 1, 2: list<element> of 2**40 elements }
    huge = 2**40
    varint = bytearray()
    while True:
        byte, huge = huge & 0x7F, huge >> 7
        varint.append(byte | (0x80 if huge else 0))
        if not huge:
            break
    thrift = _field(1, 5) + b"\x02" + _field(1, 9) + bytes([0xF0 | element]) + bytes(varint)
    start = time.monotonic()
    with pytest.raises(CorruptFileError, match="claims"):
        parse_footer(thrift + b"\x00" * 16, "f.parquet", 10**6)
    assert time.monotonic() - start < 1.0


def test_an_encrypted_column_is_unsupported_naming_the_column_chunk() -> None:
    # FileMetaData {3: num_rows 5, 4: [RowGroup {1: [ColumnChunk {8: struct {}}], 3: 5}]}
    chunk = _field(8, 12) + b"\x00" + b"\x00"
    group = _field(1, 9) + b"\x1c" + chunk + _field(2, 6) + b"\x0a" + b"\x00"
    thrift = _field(3, 6) + b"\x0a" + _field(1, 9) + b"\x1c" + group + b"\x00"
    with pytest.raises(UnsupportedFileError, match=r"row group 0 column chunk 0: .*encrypted"):
        parse_footer(thrift, "f.parquet", 10**6)


def test_the_schema_cache_is_bounded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(parquet_facts, "_SCHEMAS", {})
    monkeypatch.setattr(parquet_facts, "_SCHEMAS_KEPT", 2)
    fs = FileSystemSpec("file")
    table = _tables()["flat"]
    for i in range(5):
        path = tmp_path / f"f{i}.parquet"
        pq.write_table(table.replace_schema_metadata({"n": str(i)}), path)
        facts = read_facts(ListedFile(str(path), path.stat().st_size, ""), (), fs, ReadOptions())
        assert facts.schema.metadata == {b"n": str(i).encode()}
        assert len(parquet_facts._SCHEMAS) <= 2


def test_a_footer_read_from_a_buffer_holds_only_the_footer() -> None:
    # What `_arrow_schema` relies on: pyarrow parses a footer from its bytes alone.
    sink = pa.BufferOutputStream()
    pq.write_table(_tables()["nested"], sink)
    data = sink.getvalue().to_pybytes()
    length = int.from_bytes(data[-8:-4], "little")
    tail = data[-8 - length :]
    assert tail.endswith(MAGIC)
    assert (
        pq.read_metadata(pa.BufferReader(tail))
        .schema.to_arrow_schema()
        .equals(pq.read_schema(pa.BufferReader(data)))
    )


# --- what Thrift readers accept and real writers write (fastparquet) --------------------------

_EMPTY_OF_NO_TYPE = b"\x00"  # a list header: 0 elements, element type 0 (fastparquet's)


def test_an_empty_list_of_element_type_0_parses_as_thrift_reads_it() -> None:
    # FileMetaData {3: num_rows 0, 4: row_groups [], 5: key_value_metadata []}, both lists
    # written as fastparquet writes an empty list.
    thrift = (
        _field(3, 6)
        + b"\x00"
        + _field(1, 9)
        + _EMPTY_OF_NO_TYPE
        + _field(1, 9)
        + _EMPTY_OF_NO_TYPE
        + b"\x00"
    )
    footer = parse_footer(thrift, "f.parquet", 10**6)
    assert footer.num_rows == 0
    assert footer.row_groups == ()


@pytest.mark.parametrize(
    ("field", "header", "message"),
    [
        (5, b"\x20", "2 elements has no element type"),  # a skipped list
        (4, b"\x10", "a list of structs holds another type"),  # the row groups
        (5, b"\x0d", "unknown Thrift type 13"),  # Thrift refuses types 13-15 even when empty
        (4, b"\x0e", "a list of structs holds another type"),
    ],
)
def test_a_list_whose_elements_have_no_type_is_still_corrupt(
    field: int, header: bytes, message: str
) -> None:
    thrift = _field(3, 6) + b"\x00" + _field(field - 3, 9) + header + b"\x00" * 4
    with pytest.raises(CorruptFileError, match=message):
        parse_footer(thrift, "f.parquet", 10**6)


def test_a_stop_type_ends_a_skipped_struct_whatever_its_id_bits() -> None:
    # FileMetaData {3: num_rows 0, 4: [], 7: struct {0x10}}: Thrift's compact reader ends a
    # struct at any field header of type 0 (here with a field-id delta of 1).
    thrift = _field(3, 6) + b"\x00" + _field(1, 9) + b"\x00" + _field(3, 12) + b"\x10" + b"\x00"
    assert parse_footer(thrift, "f.parquet", 10**6).row_groups == ()


def test_fastparquet_footers_walk_as_pyarrow_reads_them(tmp_path: Path) -> None:
    """The footers a user's fastparquet 2024.5 file was refused for: every column chunk's empty
    key-value metadata (and a zero-row file's row groups) written as ``0x00``."""
    import fastparquet

    from tests.corpus.thrift_edit import List, decode, footer
    from tests.corpus.writers import files

    assert fastparquet.__version__ == "2024.5.0"
    written = {w.name: w for w in files() if w.name.startswith("fastparquet-")}
    assert len(written) >= 4
    for name, w in written.items():
        path = tmp_path / f"{name}.parquet"
        w.write(path)
        thrift, size = _footer(path)
        meta = decode(footer(path.read_bytes())[1])
        groups = meta.get(4)
        # ColumnChunk.meta_data.key_value_metadata, or a zero-row file's row groups: an empty
        # list of element type 0
        empty = groups.values[0].get(1).values[0].get(3).get(8) if groups.values else groups
        assert isinstance(empty, List) and empty.element == 0 and not empty.values, name
        parsed = parse_footer(thrift, str(path), size)
        expected = pq.read_metadata(path)
        assert len(parsed.row_groups) == expected.num_row_groups
        for i, (rows, columns) in enumerate(parsed.row_groups):
            group = expected.row_group(i)
            assert rows == group.num_rows
            assert [c.compressed for c in columns] == [
                group.column(j).total_compressed_size for j in range(group.num_columns)
            ]


def test_a_kept_integer_of_a_column_chunk_past_10_bytes_is_corrupt() -> None:
    # FileMetaData {3: num_rows 5, 4: [RowGroup {1: [ColumnChunk {3: ColumnMetaData {
    # 6: total_uncompressed_size, a varint that goes on past 10 bytes}}]}]}: the walk reads that
    # field inline, with the same limit as `thrift.varint`.
    meta = _field(6, 6) + b"\x80" * 11 + b"\x01" + b"\x00"
    chunk = _field(3, 12) + meta + b"\x00"
    group = _field(1, 9) + b"\x1c" + chunk + _field(2, 6) + b"\x0a" + b"\x00"
    thrift = _field(3, 6) + b"\x0a" + _field(1, 9) + b"\x1c" + group + b"\x00"
    with pytest.raises(CorruptFileError, match="a varint runs past 10 bytes"):
        parse_footer(thrift, "f.parquet", 10**6)


def test_a_skipped_struct_nested_past_the_limit_is_corrupt_not_a_recursion_error() -> None:
    # FileMetaData {3: num_rows 0, 4: [], 7: struct {1: struct {1: struct ... 40 deep}}}
    deep = b"\x1c" * 40 + b"\x00" * 41
    thrift = _field(3, 6) + b"\x00" + _field(1, 9) + b"\x00" + _field(3, 12) + deep + b"\x00"
    with pytest.raises(CorruptFileError, match="nests too deep"):
        parse_footer(thrift, "f.parquet", 10**6)
