"""A packed dataset's token counts from Parquet footers (`formats/parquet/tokens.py`): the same
as the counts read and as the truth (computed here from the documents), and taken from the
footer alone where it tells them: files whose data pages are overwritten still plan."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from tests.corpus.cases import ROOT
from torch_dataloader_utils.errors import CorruptFileError
from torch_dataloader_utils.formats import Listing, ReadOptions, get_format
from torch_dataloader_utils.formats.parquet.footer import Footer, read_footer
from torch_dataloader_utils.formats.parquet.tokens import (
    TokenLeaf,
    definition_levels,
    from_levels,
    from_null_count,
    null_count,
    nulls_counted,
    row_group_tokens,
)
from torch_dataloader_utils.fs import FileSystemSpec, list_files
from torch_dataloader_utils.planning import Chunk
from torch_dataloader_utils.sources.broadcast import Spread
from torch_dataloader_utils.sources.counting import count_tokens
from torch_dataloader_utils.sources.steps import plan_files

pytestmark = pytest.mark.timeout(60)

Documents = list[list[int | None] | None]
FS = FileSystemSpec("file")
# (nullable list, nullable elements): each way a list<int> column's levels can be laid out.
SHAPES = [(True, True), (True, False), (False, True), (False, False)]


def documents(nullable_list: bool, nullable_elements: bool, n: int = 60) -> Documents:
    """Documents of 0-6 tokens: with null lists, empty lists and null elements where the
    shape allows them."""
    rng = np.random.default_rng(n)
    out: Documents = []
    for _ in range(n):
        if nullable_list and rng.random() < 0.2:
            out.append(None)
            continue
        doc: list[int | None] = [int(t) for t in rng.integers(0, 1000, int(rng.integers(0, 7)))]
        if nullable_elements and doc and rng.random() < 0.3:
            doc[int(rng.integers(0, len(doc)))] = None
        out.append(doc)
    return out


def token_type(nullable_list: bool, nullable_elements: bool) -> pa.Field:
    element = pa.field("element", pa.int64(), nullable_elements)
    return pa.field("tokens", pa.list_(element), nullable_list)


def write(path: Path, docs: Documents, field: pa.Field, *, row_group_size: int = 7) -> None:
    ids = pa.array(range(len(docs)), pa.int64())
    schema = pa.schema([pa.field("id", pa.int64(), False), field])
    pq.write_table(
        pa.table([ids, pa.array(docs, field.type)], schema=schema),
        path,
        row_group_size=row_group_size,
    )


def truth(docs: Documents, eos: bool) -> int:
    """Tokens as a packed dataset counts them: a list's values (a null element is one), and one
    more per list that is not null with ``eos``."""
    present = [d for d in docs if d is not None]
    return sum(len(d) for d in present) + (len(present) if eos else 0)


def truths(chunks: list[Chunk], docs: Documents, eos: bool) -> list[int]:
    """`truth` of each chunk's rows (one file's chunks, in order)."""
    out, at = [], 0
    for c in chunks:
        out.append(truth(docs[at : at + c.num_rows], eos))
        at += c.num_rows
    assert at == len(docs)
    return out


@pytest.mark.parametrize("split_rows", [None, 3, 20])
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: f"list{int(s[0])}-elements{int(s[1])}")
def test_footer_counts_are_the_counts_read_and_the_truth(
    tmp_path: Path, shape: tuple[bool, bool], split_rows: int | None
) -> None:
    docs = documents(*shape)
    write(tmp_path / "a.parquet", docs, token_type(*shape))
    fmt = get_format("parquet")
    files = list_files(str(tmp_path), FS)
    options = ReadOptions(columns=("tokens",), tokens="tokens", split_rows=split_rows)
    plan = fmt.plan(Listing.of(files), FS, options)
    chunks = list(plan.chunks)
    assert plan.token_counts is not None and len(plan.token_counts) == len(chunks) > 1
    # A chunk is whole row groups (7 rows each), split_rows smaller than one included.
    assert all(c.num_rows % 7 == 0 for c in chunks[:-1])
    # Told wherever the footer can tell it: the histogram (pyarrow writes it), or else the
    # null count when no null element can hide among the nulls.
    footer, _ = _footer(tmp_path / "a.parquet")
    histograms = all(cols[1].sizes is not None for _, cols in footer.row_groups)
    if histograms or not shape[1]:
        assert all(t is not None for t in plan.token_counts)
    reading = ReadOptions(columns=("tokens",))
    for eos in (False, True):
        told = count_tokens(chunks, fmt, FS, reading, "tokens", eos=eos, told=plan.token_counts)
        read = count_tokens(chunks, fmt, FS, reading, "tokens", eos=eos)
        assert told == read == truths(chunks, docs, eos)


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: f"list{int(s[0])}-elements{int(s[1])}")
def test_each_footer_field_tells_the_truth_where_it_tells(
    tmp_path: Path, shape: tuple[bool, bool]
) -> None:
    """The histogram and the null count checked apart, on the same real footers: ``num_values
    - null_count`` is the tokens where no null element can hide among the nulls."""
    docs = documents(*shape, n=200)
    write(tmp_path / "a.parquet", docs, token_type(*shape), row_group_size=23)
    footer, created_by = _footer(tmp_path / "a.parquet")
    assert nulls_counted(created_by)
    list_level = int(shape[0])
    leaf = TokenLeaf(1, list_level, list_level + 1 + int(shape[1]), nulls_counted=True)
    at = null_counts = 0
    for rows, columns in footer.row_groups:
        column = columns[1]
        part = docs[at : at + rows]
        at += rows
        expected = (truth(part, False), truth(part, True) - truth(part, False))
        told = row_group_tokens(leaf, rows, column, footer.thrift)
        if column.sizes is not None or not shape[1]:
            assert told == expected
        assert told is None or told == expected
        # One slot per value, null element, empty list and null list; a null each below the
        # maximum level: null elements, empty lists and null lists.
        slots = column.values
        assert slots == sum(1 if not d else len(d) for d in part)
        nulls = null_count(footer.thrift, column.statistics)
        assert nulls == sum(1 if not d else d.count(None) for d in part)
        by_count = from_null_count(leaf, rows, slots, nulls)
        if by_count is not None:
            null_counts += 1
            assert by_count[0] == expected[0]
            assert by_count[1] in (None, expected[1])
        no_histogram = dataclasses.replace(column, sizes=None)
        assert row_group_tokens(leaf, rows, no_histogram, footer.thrift) == by_count
        levels = definition_levels(footer.thrift, column.sizes)
        if levels is not None and leaf.max_level > 1:
            assert from_levels(leaf, rows, slots, levels, nulls) == expected
        # A writer whose null count is not trusted: only the histogram tells.
        untrusted = dataclasses.replace(leaf, nulls_counted=False)
        alone = row_group_tokens(untrusted, rows, column, footer.thrift)
        assert alone is None or alone == expected
    assert at == len(docs)
    assert null_counts or shape[1]  # required elements: the null count always tells


def test_nulls_counted_by_the_writers_the_evidence_names() -> None:
    assert nulls_counted("parquet-cpp-arrow version 26.0.1")
    assert nulls_counted("parquet-cpp-arrow version 15.0.0-SNAPSHOT")
    assert nulls_counted(
        "parquet-mr version 1.8.0 (build 0fda28af84be9d9b6a4d32b0da15fe8b3dd8a5e3)"
    )
    assert nulls_counted("parquet-rs version 53.2.0")
    # Before PARQUET-2067 (Arrow 6), and the parquet-cpp that came before Arrow's.
    assert not nulls_counted("parquet-cpp-arrow version 5.0.0")
    assert not nulls_counted("parquet-cpp version 1.5.1-SNAPSHOT")
    assert not nulls_counted("DuckDB version v1.1.0")
    assert not nulls_counted(None)


def _corrupt_pages(path: Path) -> None:
    """Overwrite every column chunk's pages; the footer stays as written."""
    metadata = pq.read_metadata(path)
    data = bytearray(path.read_bytes())
    for i in range(metadata.num_row_groups):
        for j in range(metadata.num_columns):
            c = metadata.row_group(i).column(j)
            start = c.dictionary_page_offset if c.has_dictionary_page else c.data_page_offset
            data[start : start + c.total_compressed_size] = b"\xff" * c.total_compressed_size
    path.write_bytes(bytes(data))


def _plan(root: Path, **options: object) -> tuple[int, ...] | None:
    given: dict[str, Any] = {"filters": None, "split_rows": None, "eos": False, **options}
    planned = plan_files(
        str(root),
        get_format("parquet"),
        FS,
        spread=Spread(explicit=True),
        kept=None,
        cache=None,
        columns=None,
        partitioning=None,
        split_bytes=None,
        tokens="tokens",
        **given,
    )
    assert planned.read_options.tokens is None  # planning's, never the reads'
    return planned.chunk_tokens


@pytest.mark.parametrize("large", [False, True])
def test_footer_counts_read_no_page(tmp_path: Path, large: bool) -> None:
    """Files whose pages are overwritten plan from their footers (the first file stays
    readable: planning samples its first rows); whatever the footer does not tell is read, and
    fails on them: a filter, a large list."""
    docs = documents(True, True, n=24)
    field = token_type(True, True)
    if large:
        field = field.with_type(pa.large_list(field.type.value_field))
    for i in range(3):
        write(tmp_path / f"part-{i}.parquet", docs, field, row_group_size=8)
        if i:
            _corrupt_pages(tmp_path / f"part-{i}.parquet")
    if large:
        with pytest.raises(CorruptFileError, match=r"part-1\.parquet"):
            _plan(tmp_path)
        return
    for eos in (False, True):
        per_group = [truth(docs[k : k + 8], eos) for k in range(0, 24, 8)]
        assert _plan(tmp_path, eos=eos) == tuple(per_group * 3)
        # Chunks of whole row groups: smaller split_rows keep them whole, larger group them.
        assert _plan(tmp_path, eos=eos, split_rows=5) == tuple(per_group * 3)
        assert _plan(tmp_path, eos=eos, split_rows=16) == (sum(per_group[:2]), per_group[2]) * 3
    with pytest.raises(CorruptFileError, match=r"part-1\.parquet"):
        _plan(tmp_path, filters=pc.field("id") >= 0)  # a filter changes which rows count


def test_a_filter_counts_the_rows_that_pass(tmp_path: Path) -> None:
    docs = documents(True, True)
    write(tmp_path / "a.parquet", docs, token_type(True, True))
    odd = [d for k, d in enumerate(docs) if k % 2]
    for eos in (False, True):
        counts = _plan(tmp_path, eos=eos, filters=pc.field("id").isin(range(1, 60, 2)))
        assert counts is not None and sum(counts) == truth(odd, eos)
        assert sum(_plan(tmp_path, eos=eos) or ()) == truth(docs, eos)


# Real-world files with a list<int> column (`../shared/realworld-data`; every such column found
# there), and whether their footers tell the tokens and the documents.
REAL = [
    # parquet-mr 1.8.0, required elements: the null count tells both.
    ("parquet-testing/data/nonnullable.impala.parquet", "Int_Array", (True, True)),
    # parquet-mr 1.8.1, a nullable list of required elements: the tokens, not the documents.
    ("parquet-testing/data/datapage_v2.snappy.parquet", "e", (True, False)),
    # parquet-rs 53.2.0, a 2-level list (maximum level 1): the null count tells both.
    ("parquet-testing/data/repeated_primitive_no_list.parquet", "Int32_list", (True, True)),
    # Nullable elements, no histogram: null elements may hide among the nulls.
    ("parquet-testing/data/nullable.impala.parquet", "int_array", (False, False)),
    ("parquet-testing/bad_data/ARROW-GH-41317.parquet", "list_int64", (False, False)),
    ("arrow-testing/data/parquet/alltypes-java.parquet", "list", (False, False)),
    # parquet-cpp 1.5.1, whose null count leaves null lists out (see the next test).
    ("parquet-testing/data/list_columns.parquet", "int64_list", (False, False)),
    # parquet-rs 53.2.0 without statistics nor histograms.
    ("parquet-testing/data/map_no_value.parquet", "my_list", (False, False)),
    # A large list: counted by reading.
    ("arrow-testing/data/parquet/alltypes-java.parquet", "largelist", (False, False)),
]


def _corpus() -> Path:
    if not ROOT.is_dir() and os.environ.get("CI", "").lower() != "true":
        pytest.skip(f"no corpus at {ROOT}")
    return ROOT


@pytest.mark.parametrize(("relpath", "column", "tells"), REAL, ids=str)
def test_real_world_lists(relpath: str, column: str, tells: tuple[bool, bool]) -> None:
    path = _corpus() / relpath
    fmt = get_format("parquet")
    files = list_files(str(path), FS)
    plan = fmt.plan(Listing.of(files), FS, ReadOptions(columns=(column,), tokens=column))
    chunks = list(plan.chunks)
    assert plan.token_counts is not None
    for told in plan.token_counts:
        assert (told is not None, told is not None and told[1] is not None) == tells
    docs = pq.read_table(path, columns=[column]).column(column).to_pylist()
    reading = ReadOptions(columns=(column,))
    for eos in (False, True):
        told = count_tokens(chunks, fmt, FS, reading, column, eos=eos, told=plan.token_counts)
        read = count_tokens(chunks, fmt, FS, reading, column, eos=eos)
        assert told == read == truths(chunks, docs, eos)


def test_an_old_writers_null_count_leaves_null_lists_out(tmp_path: Path) -> None:
    """Why the writer matters: parquet-cpp 1.5.1's ``utf8_list`` holds a null list and a null
    element, and its null count is 1; Arrow's, since PARQUET-2067, is 2."""
    path = _corpus() / "parquet-testing/data/list_columns.parquet"
    footer, created_by = _footer(path)
    assert created_by == "parquet-cpp version 1.5.1-SNAPSHOT" and not nulls_counted(created_by)
    table = pq.read_table(path, columns=["utf8_list"])
    docs = table.column(0).to_pylist()
    assert docs.count(None) == 1 and sum(d.count(None) for d in docs if d) == 1
    column = footer.row_groups[0][1][1]
    assert column.values == 8 and null_count(footer.thrift, column.statistics) == 1
    pq.write_table(table, tmp_path / "again.parquet")
    again, _ = _footer(tmp_path / "again.parquet")
    column = again.row_groups[0][1][0]
    assert column.values == 8 and null_count(again.thrift, column.statistics) == 2


def _footer(path: Path) -> tuple[Footer, str | None]:
    """The footer as planning parses it, and its writer."""
    with pa.OSFile(str(path)) as source:
        footer, _, _ = read_footer(source, path.stat().st_size, str(path))
    return footer, pq.read_metadata(path).created_by
