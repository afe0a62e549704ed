"""Plan-time counts of each chunk: rows that pass a filter, and tokens of a list column."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from torch_dataloader_utils.formats import Listing, ReadOptions, get_format
from torch_dataloader_utils.fs import FileSystemSpec, list_files
from torch_dataloader_utils.sources.counting import count_rows, count_tokens

pytestmark = pytest.mark.timeout(60)


def test_tokens_and_rows_of_each_chunk_after_the_filter(tmp_path: Path) -> None:
    documents = [[1, 2, 3], [], None, [4], [5, 6], [7, 8, 9, 10], None, [11]]
    table = pa.table(
        {"id": pa.array(range(len(documents))), "tokens": pa.array(documents, pa.list_(pa.int32()))}
    )
    pq.write_table(table, tmp_path / "a.parquet", row_group_size=3)
    fs = FileSystemSpec("file")
    fmt = get_format("parquet")
    files = list_files(str(tmp_path), fs)
    chunks = list(fmt.plan(Listing.of(files), fs, ReadOptions()).chunks)
    assert [c.num_rows for c in chunks] == [3, 3, 2]
    everything = ReadOptions(columns=("tokens",))
    assert count_tokens(chunks, fmt, fs, everything, "tokens") == [3, 7, 1]
    odd = pc.field("id").isin([1, 3, 5, 7])
    filtered = ReadOptions(columns=("id", "tokens"), filter=odd)
    assert count_tokens(chunks, fmt, fs, filtered, "tokens") == [0, 5, 1]
    assert count_rows(chunks, fmt, fs, ReadOptions(columns=("id",), filter=odd)) == [1, 2, 1]
