"""Formats are stateless: planning leaves the format as constructed, and what a read needs of
the plan travels in the plan's read options, so a copy of the format that never planned (a
worker's, another rank's) reads exactly the planned rows."""

from __future__ import annotations

import dataclasses
import pickle
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv
import pytest
import webdataset as wds

import torch_dataloader_utils as tdu
from tests.conftest import write_parquet
from tests.format_files import write_ipc, write_orc
from torch_dataloader_utils.errors import InvalidArgumentError
from torch_dataloader_utils.formats import Format, Listing, ReadOptions, get_format
from torch_dataloader_utils.formats.text.options import TextReadOptions
from torch_dataloader_utils.fs import FileSystemSpec, list_files
from torch_dataloader_utils.webdataset.format import WebDatasetFormat, WebDatasetReadOptions

FS = FileSystemSpec("file")

# Per format: its options, and the suffix of its files.
FORMATS: dict[str, tuple[dict[str, Any], str]] = {
    "csv": ({"chunk_bytes": 512}, "csv"),
    "json": ({"chunk_bytes": 512}, "jsonl"),
    "webdataset": ({"index_cache_dir": "", "missing_component": "skip"}, "tar"),
    "parquet": ({}, "parquet"),
    "orc": ({}, "orc"),
    "ipc": ({}, "arrow"),
}


def write_source(root: Path, name: str) -> Path:
    """Three files of 40 rows (ids 0-119). CSV's ``x`` is empty in the first 45 rows: planning
    infers a string column whose empty values are nulls. WebDataset's last shard alone has a
    ``txt`` component, and every fourth sample lacks ``cls`` (skipped)."""
    root.mkdir()
    suffix = FORMATS[name][1]
    for k in range(3):
        ids = np.arange(40 * k, 40 * (k + 1))
        path = root / f"p{k}.{suffix}"
        if name == "csv":
            pacsv.write_csv(
                pa.table({"id": ids, "x": ["" if i < 45 else str(i) for i in ids]}), path
            )
        elif name == "json":
            path.write_text("".join(f'{{"id": {i}, "x": {i * 0.5}}}\n' for i in ids))
        elif name == "webdataset":
            with wds.TarWriter(str(path)) as writer:
                for i in ids:
                    sample: dict[str, Any] = {"__key__": f"s{i:04d}", "id": str(i)}
                    if i % 4:
                        sample["cls"] = int(i % 3)
                    if k == 2:
                        sample["txt"] = f"only in the last shard {i}"
                    writer.write(sample)
        elif name == "parquet":
            write_parquet(path, ids, row_group_size=16)
        elif name == "orc":
            write_orc(path, ids, stripe_rows=16)
        else:
            write_ipc(path, ids, batch_rows=16)
    return root


def planned_ids(name: str) -> Counter[int]:
    """The ids the plan holds. WebDataset's "skip" of all columns leaves out samples without
    ``cls``, and the first two shards (no ``txt``)."""
    return Counter(i for i in range(120) if name != "webdataset" or (i % 4 and i >= 80))


@pytest.mark.parametrize("name", sorted(FORMATS))
def test_planning_leaves_the_format_as_constructed(tmp_path: Path, name: str) -> None:
    fmt = get_format(name, FORMATS[name][0])
    before = pickle.dumps(fmt)
    files = list_files(str(write_source(tmp_path / name, name)), FS)
    for options in (ReadOptions(), ReadOptions(columns=("id",), split_rows=7)):
        plan = fmt.plan(Listing.of(files), FS, options)
        assert pickle.dumps(fmt) == before
        if plan.read_options is not None:  # built from the options given
            assert plan.read_options.columns == options.columns
            assert plan.read_options.split_rows == options.split_rows
    assert before == pickle.dumps(get_format(name, FORMATS[name][0]))


@pytest.mark.parametrize("name", sorted(FORMATS))
def test_a_format_that_never_planned_reads_the_planned_rows(tmp_path: Path, name: str) -> None:
    """A dataset plans; a new instance of its format, built from the same options, reads the
    plan's chunks with the plan's read options: the planned rows, in the plan's schema."""
    options = FORMATS[name][0]
    source = write_source(tmp_path / name, name)
    dataset = tdu.StructuredDataset(str(source), format=name, format_options=options)
    fresh: Format = type(dataset.format)(**options)
    got: Counter[int] = Counter()
    for chunk in dataset.plan.chunks:
        batches = list(fresh.read(chunk, 0, chunk.num_rows, dataset.fs, dataset.read_options))
        table = pa.Table.from_batches(batches, schema=dataset.plan.schema)
        assert table.num_rows == chunk.num_rows
        got.update(int(i) for i in table.column("id").to_pylist())
    fresh.close()
    assert got == planned_ids(name)
    # The dataset reads with its format as constructed: nothing of the plan is on it.
    assert pickle.dumps(dataset.format) == pickle.dumps(get_format(name, options))


def test_text_read_options_carry_the_inferred_types(tmp_path: Path) -> None:
    source = write_source(tmp_path / "csv", "csv")
    dataset = tdu.StructuredDataset(str(source), format="csv", format_options={"chunk_bytes": 512})
    options = dataset.read_options
    assert isinstance(options, TextReadOptions)
    assert set(options.specs) == {f.path for f in list_files(str(source), FS)}
    spec = options.specs[str(source / "p1.csv")]
    assert spec.schema.field("x").type == pa.string() and spec.empty_is_null == ("x",)
    # Without them a new instance cannot know the types planning fixed, and says so.
    chunk = dataset.plan.chunks[-1]
    with pytest.raises(InvalidArgumentError, match="plan's read options"):
        list(get_format("csv").read(chunk, 0, 1, FS, ReadOptions()))
    # With them, the planned string column's empty values are nulls, in any file.
    first = next(get_format("csv").read(dataset.plan.chunks[0], 0, 1, FS, options))
    assert first.column("x").to_pylist() == [None]


def test_webdataset_read_options_carry_the_columns_found_and_what_skips(tmp_path: Path) -> None:
    source = write_source(tmp_path / "webdataset", "webdataset")
    options = {"index_cache_dir": "", "missing_component": "empty"}
    dataset = tdu.StructuredDataset(str(source), format="webdataset", format_options=options)
    planned = dataset.read_options
    assert isinstance(planned, WebDatasetReadOptions)
    assert planned.all_columns == ("__key__", "__url__", "id", "cls", "txt")
    assert planned.skipping == (("id",), ("cls",), ("txt",))
    # A new instance reading the first shard (no txt component) yields every planned column.
    chunk = dataset.plan.chunks[0]
    batch = next(WebDatasetFormat(**options).read(chunk, 0, chunk.num_rows, FS, planned))
    assert batch.schema.names == list(planned.all_columns)
    assert batch.column("txt").to_pylist()[:2] == ["", ""]  # "empty": no component, no value


def test_filters_are_counted_with_the_plans_read_options(tmp_path: Path) -> None:
    """Counting reads only the filter's columns, with the plan's read options otherwise: a
    WebDataset chunk keeps the rows planned with more columns (samples without ``cls`` stay
    skipped though the count reads ``id`` alone), and CSV keeps its inferred types."""
    web = tdu.StructuredDataset(
        str(write_source(tmp_path / "webdataset", "webdataset")),
        format="webdataset",
        columns=["cls"],
        filters=pc.field("id") < 50,
        format_options=FORMATS["webdataset"][0],
    )
    kept = [i for i in range(120) if i % 4 and i < 50]
    assert web.plan.filtered_rows is not None and sum(web.plan.filtered_rows) == len(kept)
    csv = tdu.StructuredDataset(
        str(write_source(tmp_path / "csv", "csv")),
        format="csv",
        filters=pc.field("id") >= 60,
        format_options={"chunk_bytes": 512},
    )
    assert csv.plan.filtered_rows is not None and sum(csv.plan.filtered_rows) == 60


def test_counting_options_keep_the_subclass() -> None:
    planned = WebDatasetReadOptions.of(ReadOptions(columns=("a", "b")), skipping=(("a",),))
    counting = dataclasses.replace(planned, columns=("a",))
    assert isinstance(counting, WebDatasetReadOptions) and counting.skipping == (("a",),)
    assert ReadOptions.of(planned) == ReadOptions(columns=("a", "b"))
