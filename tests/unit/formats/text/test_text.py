"""`CsvFormat` and `JsonFormat`: chunks cut at record starts read exactly what pyarrow reads
from the whole file, compressed and unsplittable files, options, and the errors of bad input."""

from __future__ import annotations

import bz2
import dataclasses
import gzip
import json
import lzma
import random
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.csv as pacsv
import pytest

from torch_dataloader_utils.errors import (
    ColumnNotFoundError,
    CorruptFileError,
    InvalidArgumentError,
    SchemaMismatchError,
)
from torch_dataloader_utils.formats import Format, FormatPlan, Listing, ReadOptions, get_format
from torch_dataloader_utils.formats.text import CsvFormat, JsonFormat
from torch_dataloader_utils.fs import FileSystemSpec, list_files
from torch_dataloader_utils.planning import Chunk

FS = FileSystemSpec("file")


def read_all(fmt: Format, source: Any, options: ReadOptions | None = None) -> pa.Table:
    """Plan ``source`` and read every chunk in plan order, with the plan's read options."""
    plan = plan_of(fmt, source, options or ReadOptions())
    reading = plan.read_options or ReadOptions()
    batches = [b for c in plan.chunks for b in fmt.read(c, 0, c.num_rows, FS, reading)]
    return pa.Table.from_batches(batches, schema=plan.schema)


def plan_of(fmt: Format, source: Any, options: ReadOptions) -> FormatPlan:
    files = list_files(str(source), FS)
    return fmt.plan(Listing.of(files), FS, options)


def plan_chunks(fmt: Format, path: Path, **options: Any) -> list[Chunk]:
    return plan_of(fmt, path, ReadOptions(**options)).chunks


def pyarrow_csv(path: Path, schema: pa.Schema) -> pa.Table:
    return pacsv.read_csv(
        path,
        parse_options=pacsv.ParseOptions(newlines_in_values=True),
        convert_options=pacsv.ConvertOptions(
            column_types=dict(zip(schema.names, schema.types, strict=True))
        ),
    )


def random_csv(rng: random.Random, rows: int) -> bytes:
    values = ["a", "b,c", 'say ""hi""', "x\ny", "x\r\ny", "", "\n", '""', "z\r\n\n"]
    lines = ["id,text,more"]
    for i in range(rows):
        texts = []
        for _ in range(2):
            value = rng.choice(values)
            quoted = rng.random() < 0.5 or any(c in value for c in ',\n\r"')
            texts.append(f'"{value}"' if quoted else value)
        lines.append(f"{i}," + ",".join(texts))
    end = rng.choice(["\n", "\r\n"])
    return (end.join(lines) + rng.choice(["", end, end + end])).encode()


def test_quoted_newlines_any_split_equal_a_whole_file_read(tmp_path: Path) -> None:
    """Boundaries land inside quoted values, between CRLFs, on doubled quotes: for many
    split sizes the chunks concatenated are pyarrow's read of the whole file."""
    rng = random.Random(11)
    for trial in range(12):
        path = tmp_path / f"t{trial}.csv"
        path.write_bytes(random_csv(rng, rng.randint(1, 120)))
        fmt = CsvFormat()
        want = pyarrow_csv(path, read_all(fmt, path).schema)
        size = path.stat().st_size
        splits = [{"split_rows": 1}, {"split_rows": 7}, {"split_bytes": 1}]
        splits += [{"split_bytes": rng.randint(2, size)} for _ in range(5)]
        splits += [{"split_bytes": rng.randint(2, 200), "split_rows": rng.randint(1, 20)}]
        for split in splits:
            chunks = plan_chunks(fmt, path, **split)
            assert sum(c.num_rows for c in chunks) == want.num_rows
            got = read_all(fmt, path, ReadOptions(**split))
            assert got.equals(want), (trial, split)
        if want.num_rows > 1:
            assert len(plan_chunks(fmt, path, split_rows=1)) == want.num_rows


def test_the_property_catches_a_scan_without_quote_parity(tmp_path: Path) -> None:
    """Cutting at every newline (as with newlines_in_values=False) on a file with quoted
    newlines is caught: the chunk parse disagrees with the planned count, loudly."""
    path = tmp_path / "q.csv"
    path.write_bytes(b'id,text\n1,"a\nb"\n2,"c"\n3,"d\ne"\n')
    fmt = CsvFormat(newlines_in_values=False)
    with pytest.raises(CorruptFileError):
        read_all(fmt, path, ReadOptions(split_rows=1))
    assert read_all(CsvFormat(), path, ReadOptions(split_rows=1)).column("id").to_pylist() == [
        1,
        2,
        3,
    ]


@pytest.mark.parametrize("name", ["csv", "json"])
def test_block_bytes_is_the_earlier_name_of_chunk_bytes(tmp_path: Path, name: str) -> None:
    """``block_bytes`` (the option's earlier name) cuts the same chunks as ``chunk_bytes``,
    with a `DeprecationWarning` naming the new one; both at once are refused."""
    if name == "csv":
        path = tmp_path / "big.csv"
        pacsv.write_csv(pa.table({"id": np.arange(3000)}), path)
    else:
        path = tmp_path / "big.jsonl"
        path.write_text("".join(f'{{"id": {i}}}\n' for i in range(3000)))
    with pytest.warns(DeprecationWarning, match="block_bytes= is deprecated.*use chunk_bytes="):
        earlier = get_format(name, {"block_bytes": 2048})
    now = get_format(name, {"chunk_bytes": 2048})
    assert earlier.chunk_bytes == now.chunk_bytes == 2048  # type: ignore[attr-defined]
    assert plan_of(earlier, path, ReadOptions()).chunks == plan_of(now, path, ReadOptions()).chunks
    assert len(plan_of(now, path, ReadOptions()).chunks) > 5
    with pytest.raises(InvalidArgumentError, match="give chunk_bytes= alone"):
        get_format(name, {"block_bytes": 2048, "chunk_bytes": 2048})


def test_default_blocks_and_one_big_file(tmp_path: Path) -> None:
    path = tmp_path / "big.csv"
    pacsv.write_csv(pa.table({"id": np.arange(5000), "x": np.arange(5000) * 0.5}), path)
    fmt = CsvFormat(chunk_bytes=4096)
    plan = plan_of(fmt, path, ReadOptions())
    chunks = plan.chunks
    assert len(chunks) > 10
    assert all(c.unit_rows == () and c.num_bytes == c.stop - c.start for c in chunks)
    assert [c.start for c in chunks[1:]] == [c.stop for c in chunks[:-1]]
    assert chunks[0].start == len(b'"id","x"\n') and chunks[-1].stop == path.stat().st_size
    got = read_all(CsvFormat(chunk_bytes=4096), path)
    assert got.column("id").to_pylist() == list(range(5000))
    # Rows [a, b) of a chunk.
    c = chunks[3]
    first = sum(x.num_rows for x in chunks[:3])
    part = pa.Table.from_batches(list(fmt.read(c, 5, 9, FS, plan.read_options)))
    assert part.column("id").to_pylist() == list(range(first + 5, first + 9))


def arrow_compressed(codec: str) -> Callable[[bytes], bytes]:
    """pyarrow's stream compression (the framed format files use)."""

    def compress(data: bytes) -> bytes:
        sink = pa.BufferOutputStream()
        with pa.CompressedOutputStream(sink, codec) as out:
            out.write(data)
        return bytes(sink.getvalue())

    return compress


@pytest.mark.parametrize(
    ("suffix", "compress"),
    [
        (".gz", gzip.compress),
        (".bz2", bz2.compress),
        (".xz", lzma.compress),
        (".zst", arrow_compressed("zstd")),
        (".lz4", arrow_compressed("lz4")),
    ],
)
def test_compressed_files_are_one_chunk_each(
    tmp_path: Path, suffix: str, compress: Callable[[bytes], bytes]
) -> None:
    text = b'id,s\n1,"a\nb"\n\n2,x\n3,y\n'
    (tmp_path / f"a.csv{suffix}").write_bytes(compress(text))
    fmt = CsvFormat()
    plan = plan_of(fmt, tmp_path, ReadOptions(split_rows=1))
    chunks = plan.chunks
    assert [(c.start, c.num_rows) for c in chunks] == [(0, 3)]
    assert chunks[0].stop == (tmp_path / f"a.csv{suffix}").stat().st_size
    rows = pa.Table.from_batches(list(fmt.read(chunks[0], 1, 3, FS, plan.read_options)))
    assert rows.to_pydict() == {"id": [2, 3], "s": ["x", "y"]}
    lines = b'{"id": 1}\n\n{"id": 2}\r\n'
    (tmp_path / f"b.jsonl{suffix}").write_bytes(compress(lines))
    got = read_all(JsonFormat(), tmp_path / f"b.jsonl{suffix}", ReadOptions(split_rows=1))
    assert got.column("id").to_pylist() == [1, 2]


def test_a_corrupt_gzip_file_is_named(tmp_path: Path) -> None:
    path = tmp_path / "a.csv.gz"
    path.write_bytes(gzip.compress(b"id\n1\n2\n")[:-12] + b"garbage!")
    with pytest.raises(CorruptFileError, match=r"a\.csv\.gz"):
        plan_chunks(CsvFormat(), path)


@pytest.mark.parametrize(
    ("text", "why"),
    [
        (b'id,s\n1,ab"c\n2,"d\ne"\n3,x\n', "quote inside an unquoted field"),
        (b"id,s\r1,a\r2,b\r3,c\r", "bare carriage returns"),
    ],
)
def test_unreliable_parity_reads_the_file_as_one_chunk(
    tmp_path: Path, text: bytes, why: str
) -> None:
    path = tmp_path / "a.csv"
    path.write_bytes(text)
    chunks = plan_chunks(CsvFormat(), path, split_rows=1)
    assert [(c.start, c.stop, c.num_rows) for c in chunks] == [(0, len(text), 3)], why
    got = read_all(CsvFormat(), path, ReadOptions(split_rows=1))
    assert got.equals(pyarrow_csv(path, got.schema))


def test_escape_char_reads_files_whole(tmp_path: Path) -> None:
    path = tmp_path / "a.csv"
    path.write_bytes(b'id,s\n1,"a\\"\nb"\n2,c\n')
    fmt = CsvFormat(escape_char="\\")
    assert [c.num_rows for c in plan_chunks(fmt, path, split_rows=1)] == [2]
    assert read_all(fmt, path).column("s").to_pylist() == ['a"\nb', "c"]


def test_headers_must_agree(tmp_path: Path) -> None:
    (tmp_path / "a.csv").write_bytes(b"id,x\n1,2\n")
    (tmp_path / "b.csv").write_bytes(b"id,y\n3,4\n")
    with pytest.raises(SchemaMismatchError, match=r"b\.csv and .*a\.csv disagree on the header"):
        plan_chunks(CsvFormat(), tmp_path)


def test_types_are_fixed_once_and_a_bad_value_is_located(tmp_path: Path) -> None:
    rows = "".join(f"{i},v{i}\n" for i in range(400))
    text = f"id,s\n{rows}12x,bad\n{rows}"
    path = tmp_path / "a.csv"
    path.write_text(text)
    fmt = CsvFormat(infer_bytes=500, chunk_bytes=1000)
    files = list_files(str(path), FS)
    plan = fmt.plan(Listing.of(files), FS, ReadOptions())
    assert plan.schema.field("id").type == pa.int64()
    offset = text.index("12x")
    with pytest.raises(CorruptFileError) as info:
        for c in plan.chunks:
            list(fmt.read(c, 0, c.num_rows, FS, plan.read_options))
    message = str(info.value)
    line = text[:offset].count("\n") + 1  # 402: the header, then 400 rows
    assert "a.csv bytes" in message and f"at line {line}, byte {offset}" in message
    assert "column 'id'" in message and "'12x'" in message and "'schema'" in message
    given = pa.schema([("id", pa.string()), ("s", pa.string())])
    got = read_all(CsvFormat(schema=given, chunk_bytes=1000), path)
    assert got.num_rows == 801 and got.schema == given


def test_a_chunk_that_infers_null_is_still_typed(tmp_path: Path) -> None:
    """Per-chunk inference would read an all-empty stretch as null: the plan's types hold."""
    path = tmp_path / "a.csv"
    path.write_text("id,x\n" + "".join(f"{i},{i}\n" for i in range(50)) + "50,\n51,\n")
    got = read_all(CsvFormat(), path, ReadOptions(split_rows=2))
    assert got.schema.field("x").type == pa.int64()
    assert got.column("x").to_pylist()[-2:] == [None, None]


def test_csv_options(tmp_path: Path) -> None:
    path = tmp_path / "a.tsv"
    path.write_bytes(b"1;'a;b';NA\n2;'c';3\n")
    fmt = get_format("csv", {"delimiter": ";", "quote_char": "'", "header": False})
    got = read_all(fmt, path, ReadOptions(split_rows=1))
    assert got.to_pydict() == {"f0": [1, 2], "f1": ["a;b", "c"], "f2": [None, 3]}
    named = CsvFormat(
        delimiter=";", quote_char="'", header=False, column_names=["id", "s", "n"], null_values=[]
    )
    assert read_all(named, path).column("n").to_pylist() == ["NA", "3"]
    projected = read_all(named, path, ReadOptions(columns=("n", "id"), split_rows=1))
    assert projected.schema.names == ["n", "id"]
    with pytest.raises(ColumnNotFoundError, match="nope"):
        read_all(named, path, ReadOptions(columns=("nope",)))


@pytest.mark.parametrize(
    "options",
    [
        {"delimit": ";"},
        {"delimiter": ";;"},
        {"chunk_bytes": 0},
        {"header": True, "column_names": ["a"]},
        {"schema": {"a": "int64"}},
    ],
)
def test_bad_options_raise(options: dict[str, Any]) -> None:
    with pytest.raises(InvalidArgumentError):
        get_format("csv", options)


def test_json_bad_options_raise() -> None:
    with pytest.raises(InvalidArgumentError):
        get_format("jsonl", {"delimiter": ","})


def test_empty_and_header_only_files(tmp_path: Path) -> None:
    (tmp_path / "a.csv").write_bytes(b"")
    (tmp_path / "b.csv").write_bytes(b"id,x\n")
    (tmp_path / "c.csv").write_bytes(b"id,x\r\n\r\n")
    files = list_files(str(tmp_path), FS)
    plan = CsvFormat().plan(Listing.of(files), FS, ReadOptions())
    assert plan.chunks == [] and plan.schema.names == ["id", "x"]
    assert CsvFormat().schema(files[1], FS).names == ["id", "x"]
    with pytest.raises(CorruptFileError, match=r"a\.csv: the file is empty"):
        CsvFormat().schema(files[0], FS)
    (tmp_path / "d.csv").write_bytes(b"id,x\n1,2")  # no trailing newline
    assert read_all(CsvFormat(), tmp_path).to_pydict() == {"id": [1], "x": [2]}


def test_json_lines(tmp_path: Path) -> None:
    path = tmp_path / "a.jsonl"
    lines = [json.dumps({"id": i, "x": i * 0.5} if i % 3 else {"id": i}) for i in range(50)]
    path.write_bytes(("\r\n  \n".join(lines[:10]) + "\n\n" + "\n".join(lines[10:])).encode())
    for split in ({}, {"split_rows": 1}, {"split_bytes": 30}):
        got = read_all(JsonFormat(), path, ReadOptions(**split))
        assert got.column("id").to_pylist() == list(range(50))
        assert got.column("x").to_pylist()[:3] == [None, 0.5, 1.0]  # missing fields are null
    projected = read_all(JsonFormat(), path, ReadOptions(columns=("x",)))
    assert projected.schema.names == ["x"]


def test_json_types_are_fixed_once(tmp_path: Path) -> None:
    path = tmp_path / "a.jsonl"
    lines = [json.dumps({"id": i}) for i in range(100)] + ['{"id": 1.5}', '{"id": 1, "z": 2}']
    path.write_text("\n".join(lines) + "\n")
    fmt = JsonFormat(infer_bytes=200, chunk_bytes=300)
    with pytest.raises(CorruptFileError, match=r"a\.jsonl bytes .*'schema'"):
        read_all(fmt, path)
    given = JsonFormat(schema=pa.schema([("id", pa.float64())]))
    got = read_all(given, path, ReadOptions(split_rows=10))
    assert got.num_rows == 102 and got.column("id")[-2].as_py() == 1.5  # z ignored


def test_a_file_changed_since_planning_is_caught(tmp_path: Path) -> None:
    path = tmp_path / "a.jsonl"
    path.write_text('{"id": 1}\n{"id": 2}\n')
    fmt = JsonFormat()
    plan = plan_of(fmt, path, ReadOptions())
    (chunk,) = plan.chunks
    path.write_text('{"id": 1}\n{"id": 2}\n{"id": 3}\n')  # the same bytes first, one more line
    changed = Chunk(chunk.path, 0, path.stat().st_size, 2, 0)
    with pytest.raises(CorruptFileError, match="parsed to 3 rows where the plan counted 2"):
        list(fmt.read(changed, 0, 2, FS, plan.read_options))


def test_read_needs_the_plan_or_a_schema(tmp_path: Path) -> None:
    path = tmp_path / "a.csv"
    path.write_text("id\n1\n")
    chunk = Chunk(str(path), 3, 5, 1, 2)
    with pytest.raises(InvalidArgumentError, match="schema"):
        list(CsvFormat().read(chunk, 0, 1, FS, ReadOptions()))
    fmt = CsvFormat(schema=pa.schema([("id", pa.int32())]))
    (batch,) = fmt.read(chunk, 0, 1, FS, ReadOptions())
    assert batch.column(0).to_pylist() == [1]


def test_a_count_without_columns_keeps_row_counts(tmp_path: Path) -> None:
    path = tmp_path / "a.csv"
    path.write_text("id,x\n1,2\n3,4\n5,6\n")
    plan = plan_of(CsvFormat(), path, ReadOptions())
    assert plan.read_options is not None
    (chunk,) = plan.chunks
    counting = dataclasses.replace(plan.read_options, columns=())  # as the planner counts
    batches = list(CsvFormat().read(chunk, 1, 3, FS, counting))  # a copy that never planned
    assert sum(b.num_rows for b in batches) == 2 and all(b.num_columns == 0 for b in batches)


def test_json_records_with_no_fields(tmp_path: Path) -> None:
    # Every record {}: nothing to infer types from, nor a column to count rows by.
    path = tmp_path / "a.jsonl"
    path.write_bytes(b"{}\n{}\n{}\n")
    with pytest.raises(CorruptFileError, match=r"a\.jsonl: no fields inferred .*'schema'"):
        read_all(JsonFormat(), path)
    given = JsonFormat(schema=pa.schema([("id", pa.int64())]))
    assert read_all(given, path).column("id").to_pylist() == [None] * 3
    # A given empty schema: rows of no columns, counted too where the plan parses the file.
    gz = tmp_path / "b.jsonl.gz"
    gz.write_bytes(gzip.compress(path.read_bytes()))
    for source in (path, gz):
        for options in (ReadOptions(), ReadOptions(columns=())):
            got = read_all(JsonFormat(schema=pa.schema([])), source, options)
            assert got.num_rows == 3 and got.num_columns == 0


@pytest.mark.parametrize(
    ("data", "cause"),
    [
        (b'{"id": 0} {"id": 1}\n{"id": 2}\n', "two JSON objects"),  # pyarrow reads 3 rows
        (b'{"id": 0}\r{"id": 1}\r\n{"id": 2}\n', r"a bare '\\r'"),
    ],
)
def test_json_lines_the_scan_miscounts_say_why(tmp_path: Path, data: bytes, cause: str) -> None:
    path = tmp_path / "a.jsonl"
    path.write_bytes(data)
    message = (
        rf"a\.jsonl bytes 0-{len(data)}: the chunk parsed to 3 rows where the plan counted 2.*"
    )
    with pytest.raises(CorruptFileError, match=message + cause):
        read_all(JsonFormat(), path)


def test_csv_newlines_in_values_false_miscount_says_why(tmp_path: Path) -> None:
    path = tmp_path / "a.csv"
    path.write_bytes(b'id,t\n1,"a\nb"\n2,c\n3,d\n')
    assert read_all(CsvFormat(), path).column("id").to_pylist() == [1, 2, 3]
    with pytest.raises(
        CorruptFileError,
        match=r"parsed to 3 rows where the plan counted 4.*"
        r"quoted value holding a newline while newlines_in_values=False",
    ):
        read_all(CsvFormat(newlines_in_values=False), path)
