"""A plan of one chunk a unit (Parquet row group, ORC stripe, IPC record batch) is built as
columns (`chunking.unit_chunks`): the same chunks, in the same columns, as `Chunks.of` over
`group_units`' chunks, so plans (and their fingerprints, which saved states name) are
unchanged."""

from __future__ import annotations

import random

import numpy as np
import pytest

from torch_dataloader_utils.formats.base import Listing, ReadOptions
from torch_dataloader_utils.formats.chunking import group_units, unit_chunks
from torch_dataloader_utils.fs import ListedFile
from torch_dataloader_utils.planning import Chunks


@pytest.mark.parametrize("seed", range(30))
def test_the_columns_are_those_of_the_chunk_objects(seed: int) -> None:
    rng = random.Random(seed)
    files, partitions, units = [], [], []
    for i in range(rng.randint(1, 12)):
        files.append(ListedFile(f"/data/k={i % 3}/part-{i}.parquet", 100, "/data", "v"))
        partitions.append(rng.choice([(), (("k", i % 3),), (("k", None),)]))
        ids = sorted(rng.sample(range(8), rng.randint(0, 4)))  # some files empty or pruned
        units.append([(g, rng.randint(0, 500), rng.randint(1, 9999)) for g in ids])
    chunks = unit_chunks(Listing.of(files, partitions), units)
    made = [
        c
        for f, p, u in zip(files, partitions, units, strict=True)
        for c in group_units(f.path, u, p, ReadOptions())
    ]
    expected = Chunks.of(made)
    assert list(chunks) == list(expected)
    for name in ("file", "start", "stop", "num_rows", "num_bytes", "unit_rows", "partition"):
        assert np.array_equal(chunks.column(name), expected.column(name)), name
