"""A Parquet plan of one chunk a row group is built as columns (`planning._row_group_chunks`):
the same chunks, in the same columns, as `Chunks.of` over `group_units`' chunks, so plans (and
their fingerprints, which saved states name) are unchanged."""

from __future__ import annotations

import random

import numpy as np
import pyarrow as pa
import pytest

from torch_dataloader_utils.formats.base import ReadOptions
from torch_dataloader_utils.formats.chunking import group_units
from torch_dataloader_utils.formats.parquet.facts import FileFacts
from torch_dataloader_utils.formats.parquet.planning import _row_group_chunks
from torch_dataloader_utils.fs import SourceFile
from torch_dataloader_utils.planning import Chunks


@pytest.mark.parametrize("seed", range(30))
def test_the_columns_are_those_of_the_chunk_objects(seed: int) -> None:
    rng = random.Random(seed)
    schema = pa.schema([("id", pa.int64())])
    files, partitions, facts = [], [], []
    for i in range(rng.randint(1, 12)):
        files.append(SourceFile(f"/data/k={i % 3}/part-{i}.parquet", 100, "/data", "v"))
        partitions.append(rng.choice([(), (("k", i % 3),), (("k", None),)]))
        ids = sorted(rng.sample(range(8), rng.randint(0, 4)))  # some files empty or pruned
        groups = [(g, rng.randint(0, 500), rng.randint(1, 9999), rng.randint(1, 9999)) for g in ids]
        facts.append(FileFacts(schema, groups))
    chunks, row_bytes = _row_group_chunks(files, partitions, facts)
    made = [
        c
        for f, p, x in zip(files, partitions, facts, strict=True)
        for c in group_units(f.path, [(g, n, b) for g, n, b, _ in x.row_groups], p, ReadOptions())
    ]
    expected = Chunks.of(made)
    assert list(chunks) == list(expected)
    for name in ("file", "start", "stop", "num_rows", "num_bytes", "unit_rows", "partition"):
        assert np.array_equal(chunks.column(name), expected.column(name)), name
    rows = sum(g[1] for x in facts for g in x.row_groups)
    assert row_bytes == (sum(g[3] for x in facts for g in x.row_groups) / rows if rows else 1.0)
