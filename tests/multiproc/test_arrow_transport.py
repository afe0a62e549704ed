"""Arrow output through real DataLoader workers (fork and spawn): batches cross in the workers'
shared buffers as Arrow IPC (`transport.ipc`) and arrive as the in-process batches would.

The data has every kind of column Arrow output passes through untouched: strings, lists,
structs, a dictionary column and a null-typed one, with nulls.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import torch_dataloader_utils as tdu

pytestmark = [
    pytest.mark.timeout(120),
    pytest.mark.filterwarnings("ignore:This DataLoader will create:UserWarning"),
]

SIZES = (250, 1000, 0, 333, 17)  # (one file without rows; 60-row batches leave a short one)
ROWS = sum(SIZES)
BATCH = 60
WORDS = ("red", "green", "blue")
SCHEMA = pa.schema(
    [
        ("id", pa.int64()),
        ("s", pa.string()),
        ("tokens", pa.list_(pa.int32())),
        ("st", pa.struct([("a", pa.int64()), ("b", pa.string())])),
        ("word", pa.dictionary(pa.int32(), pa.string())),
        ("nothing", pa.null()),
    ]
)


def _table(ids: np.ndarray) -> pa.Table:
    rows = ids.tolist()
    return pa.table(
        {
            "id": ids,
            "s": [None if i % 5 == 0 else f"row-{i}" for i in rows],
            "tokens": [None if i % 7 == 0 else list(range(i % 4)) for i in rows],
            "st": [{"a": i, "b": None if i % 3 == 0 else str(i)} for i in rows],
            "word": pa.array([None if i % 11 == 0 else WORDS[i % 3] for i in rows])
            .cast(pa.string())
            .dictionary_encode(),
            "nothing": pa.nulls(len(rows)),
        },
        schema=SCHEMA,
    )


@pytest.fixture
def source(tmp_path: Path) -> Path:
    root = tmp_path / "data"
    root.mkdir()
    start = 0
    for i, size in enumerate(SIZES):
        table = _table(np.arange(start, start + size))
        pq.write_table(table, root / f"part-{i:03d}.parquet", row_group_size=100)
        start += size
    return root


def make_loader(root: Path, **options: Any) -> tdu.TabularDataLoader:
    options.setdefault("batch_size", BATCH)
    options.setdefault("shuffle_seed", 7)
    options.setdefault("output_format", "arrow")
    if options.get("num_workers"):
        options.setdefault("multiprocessing_context", "fork")
        options.setdefault("timeout", 60)  # a stuck worker raises instead of hanging the run
    return tdu.create_dataloader(root, format="parquet", **options)


def ids_of(batch: pa.RecordBatch) -> list[int]:
    return list(batch.column("id").to_pylist())


def by_first_id(batches: list[pa.RecordBatch]) -> dict[int, pa.RecordBatch]:
    return {ids_of(b)[0]: b for b in batches}


def in_shared_memory(address: int) -> bool:
    """Whether ``address`` lies in a worker's shared buffer mapped here (a memfd or /dev/shm),
    not in memory of this process's own."""
    with open("/proc/self/maps") as maps:
        for line in maps:
            low, high = (int(x, 16) for x in line.split()[0].split("-"))
            if low <= address < high:
                return "tdu-bundle" in line or "/dev/shm" in line or "torch_" in line
    return False


@pytest.mark.parametrize("context", ["fork", pytest.param("spawn", marks=pytest.mark.slow)])
def test_arrow_batches_from_workers_equal_the_in_process_ones(source: Path, context: str) -> None:
    # Unshuffled, each worker's stream is a contiguous run of the in-process batches.
    expected = by_first_id(list(make_loader(source)))
    loader = make_loader(source, num_workers=2, multiprocessing_context=context)
    batches = list(loader)
    assert Counter(i for b in batches for i in ids_of(b)) == Counter(range(ROWS))
    assert len(batches) == len(expected)
    for batch in batches:
        assert isinstance(batch, pa.RecordBatch)
        assert batch.equals(expected[ids_of(batch)[0]])  # (schema included: dictionary, null)
    if context == "fork":  # (a spawned worker's /dev/shm files are unlinked: no name to see)
        # No copy: the batches' buffers are the workers' shared memory, mapped here.
        assert in_shared_memory(batches[0].column("s").buffers()[2].address)


def test_shuffled_arrow_batches_equal_the_pickled_ones_in_torch_outputs_order(
    source: Path,
) -> None:
    loader = make_loader(source, num_workers=2, shuffle=True, persistent_workers=True)
    # A message per batch, pickled by the DataLoader itself (no bundles, no shared buffers).
    pickled = make_loader(source, num_workers=2, shuffle=True, bundle_rows=0)
    torch_order = make_loader(
        source, num_workers=2, shuffle=True, output_format="torch", columns=["id"]
    )
    for epoch in range(2):  # (persistent workers: the second epoch reuses the pools' buffers)
        for each in (loader, pickled, torch_order):
            each.set_epoch(epoch)
        batches = list(loader)
        assert Counter(i for b in batches for i in ids_of(b)) == Counter(range(ROWS))
        expected = by_first_id(list(pickled))
        assert all(b.equals(expected[ids_of(b)[0]]) for b in batches)
        assert [ids_of(b) for b in batches] == [b["id"].tolist() for b in torch_order]


def test_a_batch_kept_across_many_later_ones_stays_intact(source: Path) -> None:
    expected = by_first_id(list(make_loader(source)))
    # A bundle a batch: 14 bundles a worker through pools of 6 buffers, so buffers are reused.
    loader = make_loader(source, num_workers=2, bundle_rows=BATCH)
    batches = iter(loader)
    kept = next(batches)
    first = ids_of(kept)[0]
    ids = kept.column("id").to_numpy()  # (zero-copy: a numpy view of the shared buffer)
    strings = kept.column("s").slice(3, 20)  # only a slice, the batch itself dropped
    words = kept.column("word")
    kept_range = _span(kept)
    del kept
    seen, later = list(ids), []
    for batch in batches:
        seen.extend(ids_of(batch))
        later.append(_span(batch))
        assert batch.equals(expected[ids_of(batch)[0]])
    assert Counter(seen) == Counter(range(ROWS))
    # The buffers were reused for later batches, never the one under what was kept.
    assert len(set(later)) < len(later)
    assert not any(low < kept_range[1] and kept_range[0] < high for low, high in later)
    reference = expected[first]
    assert ids.tolist() == reference.column("id").to_pylist()
    assert strings.equals(reference.column("s").slice(3, 20))
    assert words.equals(reference.column("word"))


def _span(batch: pa.RecordBatch) -> tuple[int, int]:
    """The addresses from the batch's first buffer to the end of its last."""
    found = [
        (b.address, b.address + b.size)
        for column in batch.columns
        for b in _buffers(column)
        if b is not None and b.size
    ]
    return min(low for low, _ in found), max(high for _, high in found)


def _buffers(array: pa.Array) -> list[pa.Buffer | None]:
    found = list(array.buffers())
    if isinstance(array, pa.DictionaryArray):
        found.extend(array.dictionary.buffers())
    return found
