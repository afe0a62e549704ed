"""``ParquetFormat``: planning row-group chunks from footers, and reading row ranges of them."""

from __future__ import annotations

import itertools
import multiprocessing
import pickle
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from tests.conftest import MakeParquetDir, make_table, write_parquet
from torch_dataloader_utils.errors import (
    ColumnNotFoundError,
    CorruptFileError,
    SchemaMismatchError,
)
from torch_dataloader_utils.formats import FormatPlan, Listing, ReadOptions, get_format
from torch_dataloader_utils.formats.handles import HandleCache
from torch_dataloader_utils.formats.parquet import ParquetFormat
from torch_dataloader_utils.fs import FileSystemSpec, ListedFile, hive_partitions, list_files
from torch_dataloader_utils.planning import Chunk


def listed(source: str | Path | Sequence[str | Path]) -> tuple[list[ListedFile], FileSystemSpec]:
    first = source if isinstance(source, str | Path) else source[0]
    fs = FileSystemSpec.for_path(first)
    return list_files(
        source if isinstance(source, str | Path) else [str(s) for s in source], fs
    ), fs


def plan(
    source: str | Path | Sequence[str | Path], options: ReadOptions | None = None
) -> tuple[FormatPlan, list[ListedFile], FileSystemSpec]:
    files, fs = listed(source)
    result = ParquetFormat().plan(Listing.of(files), fs, options or ReadOptions())
    return result, files, fs


def read_all(
    fmt: ParquetFormat,
    chunk: Chunk,
    start: int,
    stop: int,
    fs: FileSystemSpec,
    options: ReadOptions,
    schema: pa.Schema,
) -> pa.Table:
    """Rows ``[start, stop)`` of ``chunk`` as one table (of ``schema`` when no batch comes)."""
    batches = list(fmt.read(chunk, start, stop, fs, options))
    assert all(isinstance(b, pa.RecordBatch) for b in batches)
    return pa.Table.from_batches(batches, schema=schema)


def row_group_rows(path: str) -> list[int]:
    md = pq.ParquetFile(path).metadata
    return [md.row_group(i).num_rows for i in range(md.num_row_groups)]


def row_group_bytes(path: str, columns: Sequence[str] | None = None) -> list[int]:
    """Compressed bytes of each row group, of ``columns`` (top-level names) or all columns."""
    md = pq.ParquetFile(path).metadata
    out = []
    for i in range(md.num_row_groups):
        rg = md.row_group(i)
        out.append(
            sum(
                rg.column(j).total_compressed_size
                for j in range(rg.num_columns)
                if columns is None or rg.column(j).path_in_schema.split(".")[0] in columns
            )
        )
    return out


def first_row(path: str, rg: int) -> int:
    return sum(row_group_rows(path)[:rg])


# --- planning ---------------------------------------------------------------------------------


def test_one_chunk_per_row_group_by_default(parquet_dir: MakeParquetDir) -> None:
    root, total = parquet_dir((250, 1000, 333, 17))
    result, files, _ = plan(root)
    expected = []
    for f in files:
        rows = row_group_rows(f.path)
        sizes = row_group_bytes(f.path)
        expected += [(f.path, i, i + 1, r, sizes[i], (r,)) for i, r in enumerate(rows)]
    got = [(c.path, c.start, c.stop, c.num_rows, c.num_bytes, c.unit_rows) for c in result.chunks]
    assert got == expected
    assert sum(c.num_rows for c in result.chunks) == total
    assert [c.num_rows for c in result.chunks][:3] == [100, 100, 50]
    assert all(c.partition == () for c in result.chunks)
    assert result.schema.equals(make_table(np.arange(1)).schema)
    assert result.row_bytes >= 1.0


def check_grouping(chunks: Sequence[Chunk], path: str, sizes: list[int], target: int) -> None:
    """Chunks of one file are consecutive, cover it, and close as soon as they reach ``target``."""
    mine = [c for c in chunks if c.path == path]
    rows = row_group_rows(path)
    assert all(a.stop == b.start for a, b in itertools.pairwise(mine))
    assert mine[0].start == 0
    assert mine[-1].stop == len(rows)
    for k, c in enumerate(mine):
        assert c.unit_rows == tuple(rows[c.start : c.stop])
        assert c.num_rows == sum(rows[c.start : c.stop])
        amount = sum(sizes[c.start : c.stop])
        # Greedy: without its last row group a chunk is below the target ...
        assert amount - sizes[c.stop - 1] < target, (k, c)
        # ... and every chunk but a file's last reaches it.
        if k < len(mine) - 1:
            assert amount >= target, (k, c)


@pytest.mark.parametrize("split_rows", [1, 99, 100, 150, 250, 300, 1000, 5000])
def test_split_rows_groups_consecutive_row_groups(
    parquet_dir: MakeParquetDir, split_rows: int
) -> None:
    root, total = parquet_dir((250, 1000, 333, 17))
    result, files, _ = plan(root, ReadOptions(split_rows=split_rows))
    assert sum(c.num_rows for c in result.chunks) == total
    for f in files:
        check_grouping(result.chunks, f.path, row_group_rows(f.path), split_rows)


@pytest.mark.parametrize("split_bytes", [1, 2_000, 5_000, 20_000, 10**9])
def test_split_bytes_groups_consecutive_row_groups(
    parquet_dir: MakeParquetDir, split_bytes: int
) -> None:
    root, total = parquet_dir((250, 1000, 333, 17))
    for columns in [None, ("id",), ("emb", "id")]:
        result, files, _ = plan(root, ReadOptions(split_bytes=split_bytes, columns=columns))
        assert sum(c.num_rows for c in result.chunks) == total
        for f in files:
            sizes = row_group_bytes(f.path, columns)
            check_grouping(result.chunks, f.path, sizes, split_bytes)
            mine = [c for c in result.chunks if c.path == f.path]
            # Bytes are those of the projected columns.
            assert [c.num_bytes for c in mine] == [sum(sizes[c.start : c.stop]) for c in mine]


class RowGroups:
    """A file's row groups, read once, to find which hold rows matching a filter."""

    def __init__(self, path: str) -> None:
        pf = pq.ParquetFile(path)
        self.tables = [
            pf.read_row_group(i, columns=["id"]) for i in range(pf.metadata.num_row_groups)
        ]

    def matching(self, expr: pc.Expression) -> set[int]:
        return {i for i, t in enumerate(self.tables) if t.filter(expr).num_rows}


def kept_row_groups(chunks: Sequence[Chunk], path: str) -> set[int]:
    return {rg for c in chunks if c.path == path for rg in range(c.start, c.stop)}


def test_statistics_prune_row_groups_exactly_on_sorted_ids(parquet_dir: MakeParquetDir) -> None:
    root, total = parquet_dir((250, 1000, 17))
    files, fs = listed(root)
    groups = {f.path: RowGroups(f.path) for f in files}
    fmt = ParquetFormat()
    for threshold in [*range(-1, total + 2, 23), 0, 99, 100, 249, 250, 1249, 1250, 1266, 1267]:
        for expr in [
            pc.field("id") < threshold,
            pc.field("id") >= threshold,
            pc.field("id") == threshold,
            (pc.field("id") > threshold) & (pc.field("id") < threshold + 150),
        ]:
            result = fmt.plan(Listing.of(files), fs, ReadOptions(filter=expr))
            for f in files:
                # ids ascend inside each row group, so min/max statistics are tight: a row group
                # is kept exactly when it holds a matching row.
                kept = kept_row_groups(result.chunks, f.path)
                assert kept == groups[f.path].matching(expr), (threshold, str(expr), f.path)


def test_statistics_never_drop_a_row_group_with_matching_rows(tmp_path: Path) -> None:
    # Half the file has sorted ids (prunable), half shuffled ids (loose statistics): no row
    # group holding a matching row may be pruned.
    ids = np.random.default_rng(3).permutation(600)
    ids[:300] = np.sort(ids[:300])
    path = str(write_parquet(tmp_path / "mixed.parquet", ids, row_group_size=40))
    files, fs = listed(path)
    groups = RowGroups(path)
    rows = row_group_rows(path)
    fmt = ParquetFormat()
    pruned_somewhere = False
    for threshold in range(-1, 602, 13):
        for expr in [pc.field("id") < threshold, pc.field("id") == threshold]:
            result = fmt.plan(Listing.of(files), fs, ReadOptions(filter=expr, split_rows=70))
            kept = kept_row_groups(result.chunks, path)
            assert groups.matching(expr) <= kept, (threshold, str(expr))
            pruned_somewhere |= len(kept) < len(rows)
            for c in result.chunks:
                # Chunks are contiguous runs of kept row groups.
                assert c.unit_rows == tuple(rows[c.start : c.stop])
    assert pruned_somewhere


def test_hive_partition_values_prune_files(tmp_path: Path) -> None:
    write_parquet(tmp_path / "k=1" / "a.parquet", np.arange(0, 150))
    write_parquet(tmp_path / "k=2" / "a.parquet", np.arange(150, 300))
    files, fs = listed(tmp_path)
    schema, partitions = hive_partitions(files)
    options = ReadOptions(filter=pc.field("k") == 2, partition_schema=schema)
    result = ParquetFormat().plan(Listing.of(files, partitions), fs, options)
    assert {c.path for c in result.chunks} == {files[1].path}
    assert all(c.partition == (("k", 2),) for c in result.chunks)
    assert sum(c.num_rows for c in result.chunks) == 150
    both = ParquetFormat().plan(
        Listing.of(files, partitions), fs, ReadOptions(partition_schema=schema)
    )
    assert [c.partition for c in both.chunks] == [(("k", 1),)] * 2 + [(("k", 2),)] * 2


# --- reading ----------------------------------------------------------------------------------


def test_read_every_row_range_of_every_chunk(parquet_dir: MakeParquetDir) -> None:
    root, _ = parquet_dir((250, 333, 17), row_group_size=100)
    fmt = ParquetFormat()
    for split_rows in [None, 250]:
        options = ReadOptions(split_rows=split_rows)
        result, files, fs = plan(root, options)
        full = {f.path: pq.read_table(f.path) for f in files}
        for chunk in result.chunks:
            offset = first_row(chunk.path, chunk.start)
            n = chunk.num_rows
            points = sorted(
                {0, 1, 2, 49, 50, 99, 100, 101, 199, 200, 201, 250, n - 1, n} & set(range(n + 1))
            )
            for start, stop in itertools.combinations_with_replacement(points, 2):
                got = read_all(fmt, chunk, start, stop, fs, options, result.schema)
                want = full[chunk.path].slice(offset + start, stop - start)
                assert got.num_rows == stop - start, (chunk, start, stop)
                if stop > start:
                    assert got.equals(want), (chunk, start, stop)
    fmt.close()


def test_read_row_ranges_inside_a_large_row_group(tmp_path: Path) -> None:
    # One 70,000-row row group: the reader decodes it in several batches, and a range may start
    # and stop inside any of them.
    path = tmp_path / "big.parquet"
    table = pa.table({"id": np.arange(70_000), "y": np.arange(70_000) * 0.5})
    pq.write_table(table, path, row_group_size=70_000)
    result, _, fs = plan(path)
    assert [c.num_rows for c in result.chunks] == [70_000]
    chunk = result.chunks[0]
    fmt = ParquetFormat()
    points = [
        0,
        1,
        8191,
        8192,
        16383,
        16384,
        16385,
        32768,
        49153,
        65535,
        65536,
        65537,
        69_999,
        70_000,
    ]
    for start, stop in itertools.combinations(points, 2):
        got = read_all(fmt, chunk, start, stop, fs, ReadOptions(), result.schema)
        assert got.equals(table.slice(start, stop - start)), (start, stop)
    fmt.close()


def test_read_projection(parquet_dir: MakeParquetDir) -> None:
    root, _ = parquet_dir((250,))
    for columns in [("id",), ("tokens", "id"), ("emb", "name", "flag")]:
        options = ReadOptions(columns=columns)
        result, files, fs = plan(root, options)
        assert result.schema.names == list(columns)
        fmt = ParquetFormat()
        table = pq.read_table(files[0].path, columns=list(columns))
        got = pa.concat_tables(
            read_all(fmt, c, 0, c.num_rows, fs, options, result.schema) for c in result.chunks
        )
        assert got.schema.equals(result.schema)
        assert got.equals(table)


def test_missing_column_is_column_not_found(parquet_dir: MakeParquetDir) -> None:
    root, _ = parquet_dir((10, 10))
    with pytest.raises(ColumnNotFoundError, match="nope"):
        plan(root, ReadOptions(columns=("id", "nope")))


def test_zero_row_file_is_fine(tmp_path: Path) -> None:
    empty = write_parquet(tmp_path / "a-empty.parquet", np.arange(0))
    full = write_parquet(tmp_path / "b-full.parquet", np.arange(120))
    result, _, fs = plan(tmp_path)
    assert sum(c.num_rows for c in result.chunks) == 120
    fmt = ParquetFormat()
    rows = [
        read_all(fmt, c, 0, c.num_rows, fs, ReadOptions(), result.schema).num_rows
        for c in result.chunks
    ]
    assert sum(rows) == 120
    assert all(c.num_rows == 0 for c in result.chunks if c.path == str(empty))
    alone, _, _ = plan(empty)
    assert sum(c.num_rows for c in alone.chunks) == 0
    assert alone.schema.equals(pq.read_schema(full).remove_metadata())


# --- bad files --------------------------------------------------------------------------------


def good_file(tmp_path: Path) -> Path:
    return write_parquet(tmp_path / "good.parquet", np.arange(300))


@pytest.mark.parametrize("damage", ["random-bytes", "truncated", "zero-bytes", "header-only"])
def test_corrupt_files_name_the_path(tmp_path: Path, damage: str) -> None:
    raw = good_file(tmp_path).read_bytes()
    bad = tmp_path / "bad.parquet"
    data = {
        "random-bytes": np.random.default_rng(0).integers(0, 256, 5000, dtype=np.uint8).tobytes(),
        "truncated": raw[:-100],
        "zero-bytes": b"",
        "header-only": b"PAR1",
    }[damage]
    bad.write_bytes(data)
    for source in [bad, [tmp_path / "good.parquet", bad]]:
        with pytest.raises(CorruptFileError) as info:
            plan(source)
        assert str(bad) in str(info.value)
        assert isinstance(info.value, ValueError)
    files, fs = listed(bad)
    with pytest.raises(CorruptFileError, match=str(bad)):
        ParquetFormat().schema(files[0], fs)


def test_corrupt_footer_is_a_corrupt_file(tmp_path: Path) -> None:
    raw = good_file(tmp_path).read_bytes()
    footer = int.from_bytes(raw[-8:-4], "little")
    garbage = np.random.default_rng(0).integers(0, 256, footer, dtype=np.uint8).tobytes()
    bad = tmp_path / "bad.parquet"
    bad.write_bytes(raw[: -8 - footer] + garbage + raw[-8:])
    with pytest.raises(CorruptFileError, match=str(bad)):
        plan(bad)


def test_corrupt_data_pages_are_a_corrupt_file(tmp_path: Path) -> None:
    raw = bytearray(good_file(tmp_path).read_bytes())
    footer = int.from_bytes(raw[-8:-4], "little")
    end = len(raw) - 8 - footer
    raw[4:end] = np.random.default_rng(0).integers(0, 256, end - 4, dtype=np.uint8).tobytes()
    bad = tmp_path / "bad.parquet"
    bad.write_bytes(bytes(raw))
    result, _, fs = plan(bad)  # the footer is fine
    fmt = ParquetFormat()
    with pytest.raises(CorruptFileError, match=str(bad)):
        for chunk in result.chunks:
            read_all(fmt, chunk, 0, chunk.num_rows, fs, ReadOptions(), result.schema)


def test_schema_drift_names_both_files(tmp_path: Path) -> None:
    a = write_parquet(tmp_path / "a.parquet", np.arange(50))
    drifted = make_table(np.arange(50, 100))
    drifted = drifted.set_column(1, "x", drifted.column("x").cast(pa.float64()))
    b = tmp_path / "b.parquet"
    pq.write_table(drifted, b)
    with pytest.raises(SchemaMismatchError) as info:
        plan(tmp_path)
    assert str(a) in str(info.value)
    assert str(b) in str(info.value)
    assert isinstance(info.value, ValueError)
    # Reading only columns on which the files agree is fine.
    result, _, _ = plan(tmp_path, ReadOptions(columns=("id", "label")))
    assert sum(c.num_rows for c in result.chunks) == 100


def test_a_file_without_a_read_column_is_a_schema_mismatch(tmp_path: Path) -> None:
    write_parquet(tmp_path / "a.parquet", np.arange(50))
    b = tmp_path / "b.parquet"
    pq.write_table(make_table(np.arange(50, 60)).drop_columns(["label"]), b)
    with pytest.raises(SchemaMismatchError, match=str(b)):
        plan(tmp_path, ReadOptions(columns=("id", "label")))


# --- pickling ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "protocol",
    list(range(pickle.HIGHEST_PROTOCOL + 1)),
)
def test_format_pickles_and_reads_after_unpickling(
    parquet_dir: MakeParquetDir, protocol: int
) -> None:
    root, _ = parquet_dir((250, 17))
    result, files, fs = plan(root)
    fmt = ParquetFormat()
    # Pickle one that holds open files: handles must not travel.
    read_all(fmt, result.chunks[0], 0, 10, fs, ReadOptions(), result.schema)
    for original in [fmt, get_format("parquet")]:
        copy = pickle.loads(pickle.dumps(original, protocol=protocol))
        assert isinstance(copy, ParquetFormat)
        again = copy.plan(Listing.of(files), fs, ReadOptions())
        assert again.chunks == result.chunks
        for chunk in result.chunks:
            got = read_all(copy, chunk, 0, chunk.num_rows, fs, ReadOptions(), result.schema)
            want = pq.read_table(chunk.path).slice(
                first_row(chunk.path, chunk.start), chunk.num_rows
            )
            assert got.equals(want)
        copy.close()
    fmt.close()


def test_bytes_of_projected_columns_count_dotted_and_nested_names(tmp_path: Path) -> None:
    # Leaf columns map to top-level columns through the schema, not by splitting "a.b".
    table = pa.table(
        {
            "id": np.arange(100),
            "a.b": np.arange(100) * 2.0,
            "st": [{"x": 1, "y": [1, 2]}] * 100,
        }
    )
    pq.write_table(table, tmp_path / "x.parquet", row_group_size=10)
    fs = FileSystemSpec("file")
    files = list_files(str(tmp_path), fs)
    for columns in [("a.b",), ("st",), ("id", "a.b", "st")]:
        planned = ParquetFormat().plan(
            Listing.of(files), fs, ReadOptions(columns=columns, split_bytes=1)
        )
        assert len(planned.chunks) == 10, columns  # every row group closes a chunk
        assert all(c.num_bytes > 0 for c in planned.chunks), columns
    whole = ParquetFormat().plan(Listing.of(files), fs, ReadOptions()).chunks
    parts = [
        ParquetFormat().plan(Listing.of(files), fs, ReadOptions(columns=(c,))).chunks
        for c in ("id", "a.b", "st")
    ]
    for i, chunk in enumerate(whole):
        assert chunk.num_bytes == sum(p[i].num_bytes for p in parts)


def _forked_child(cache: HandleCache[str, str], closed: list[str], queue: Any) -> None:
    got = cache.get("a", lambda: "child's a")  # never the parent's handle
    cache.clear()
    queue.put((got, list(closed)))


def test_handle_cache_a_forked_child_opens_its_own_and_closes_only_those() -> None:
    closed: list[str] = []
    cache: HandleCache[str, str] = HandleCache(1, closed.append)
    assert cache.get("a", lambda: "parent's a") == "parent's a"
    assert cache.get("a", lambda: "again") == "parent's a"  # kept
    context = multiprocessing.get_context("fork")
    queue = context.Queue()
    child = context.Process(target=_forked_child, args=(cache, closed, queue))
    child.start()
    got, child_closed = queue.get(timeout=30)
    child.join(30)
    assert child.exitcode == 0
    assert (got, child_closed) == ("child's a", ["child's a"])  # the parent's stayed open
    assert cache.get("b", lambda: "parent's b") == "parent's b" and closed == ["parent's a"]
