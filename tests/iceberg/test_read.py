"""Reading a table by name: every row exactly once with real DataLoader workers (fork and
spawn), shuffled epochs, explicit ranks with equal batch counts, a big file split across
workers, and every output format."""

from __future__ import annotations

import pickle
from collections import Counter
from unittest import mock

import numpy as np
import pyarrow.parquet as pq
import pytest

from tests.conftest import QuickBatches
from tests.iceberg.conftest import GROUP_ROWS, Catalog, batch_ids, data_files, flat, loader
from torch_dataloader_utils import (
    IcebergDataset,
    InvalidArgumentError,
    Source,
    StorageNotFoundError,
    Topology,
)

pytestmark = [
    pytest.mark.timeout(120),
    pytest.mark.filterwarnings("ignore:This DataLoader will create:UserWarning"),
]

# Five data files (one per append) of 1-6 row groups; 1,517 rows; 64-row batches leave a short one.
PARTS = [range(0, 250), range(250, 850), range(850, 1183), range(1183, 1200), range(1200, 1517)]
ROWS = 1517


@pytest.fixture
def events(catalog: Catalog) -> str:
    catalog.create("events", PARTS)
    return "events"


@pytest.mark.parametrize("num_workers", [0, 2])
@pytest.mark.parametrize("shuffle", [False, True])
def test_every_row_once_per_epoch(
    catalog: Catalog, events: str, num_workers: int, shuffle: bool
) -> None:
    load, dataset = loader(catalog, events, num_workers=num_workers, shuffle=shuffle)
    epochs = []
    for epoch in range(2):
        dataset.set_epoch(epoch)
        batches = batch_ids(load)
        assert Counter(flat(batches)) == Counter(range(ROWS))
        assert len(batches) == len(load) == -(-ROWS // 64)
        epochs.append(flat(batches))
    if shuffle:
        assert epochs[0] != epochs[1]
    else:
        assert epochs[0] == epochs[1]
    if not shuffle and not num_workers:  # canonical order: files by path, rows in file order
        files = data_files(catalog.load(events))
        order = [i for f in files for i in pq.read_table(f.file_path[7:])["id"].to_pylist()]
        assert epochs[0] == order
    # Row-group chunks of five files (250 rows = 3 row groups, ...).
    assert len({c.path for c in dataset.plan.chunks}) == len(PARTS)
    assert len(dataset.plan.chunks) == sum(-(-len(p) // GROUP_ROWS) for p in PARTS)


def test_spawned_workers_read_every_row_once(catalog: Catalog, events: str) -> None:
    load, dataset = loader(
        catalog, events, num_workers=2, shuffle=True, multiprocessing_context="spawn"
    )
    dataset.set_epoch(3)
    assert Counter(flat(batch_ids(load))) == Counter(range(ROWS))


def test_values_come_with_their_ids(catalog: Catalog, events: str) -> None:
    load, _ = loader(catalog, events, output_format="dict", batch_size=500)
    for batch in load:
        ids = np.asarray(batch["id"])
        assert np.array_equal(np.asarray(batch["x"]), ids / 2)
        assert np.array_equal(np.asarray(batch["label"]), ids % 7)
        assert list(batch["name"]) == [f"row-{i}" for i in ids]


@pytest.mark.parametrize("world_size", [2, 3])
def test_explicit_ranks_get_equal_batches_and_disjoint_rows(
    catalog: Catalog, events: str, world_size: int
) -> None:
    per_rank = []
    for rank in range(world_size):
        load, _ = loader(
            catalog, events, rank=rank, world_size=world_size, shuffle=True, num_workers=2
        )
        per_rank.append(batch_ids(load))
    counts = {len(batches) for batches in per_rank}
    assert len(counts) == 1, counts  # equal batch counts: DDP never hangs
    ids = [flat(b) for b in per_rank]
    assert not set.intersection(*map(set, ids))
    union = Counter(i for part in ids for i in part)
    assert max(union.values()) == 1 and set(union) <= set(range(ROWS))
    assert len(union) > ROWS - world_size  # remainder="drop": fewer than world_size rows left


def test_one_big_file_is_split_across_workers(catalog: Catalog) -> None:
    catalog.create("big", [range(2000)])  # one data file, 20 row groups
    load, dataset = loader(catalog, "big", num_workers=2, shuffle=True, batch_size=100)
    assert len({c.path for c in dataset.plan.chunks}) == 1
    assert len(dataset.plan.chunks) == 20
    pieces = [dataset.pieces(Topology(0, 1, worker, 2), 0) for worker in range(2)]
    assert all(len(p) >= 5 for p in pieces)  # both workers read the one file
    assert Counter(flat(batch_ids(load))) == Counter(range(2000))


def test_split_rows_and_split_bytes_group_row_groups(catalog: Catalog, events: str) -> None:
    _, dataset = loader(catalog, events, split_rows=250)
    sizes = [c.stop - c.start for c in dataset.plan.chunks]
    assert max(sizes) == 3 and len(dataset.plan.chunks) == 8
    load, _ = loader(catalog, events, split_rows=250, num_workers=2, shuffle=True)
    assert Counter(flat(batch_ids(load))) == Counter(range(ROWS))
    _, whole = loader(catalog, events, split_bytes=10**9)  # one chunk per file
    assert sorted(c.num_rows for c in whole.plan.chunks) == sorted(len(p) for p in PARTS)
    _, small = loader(catalog, events, split_bytes=1)  # every row group its own chunk
    assert len(small.plan.chunks) == sum(-(-len(p) // GROUP_ROWS) for p in PARTS)


@pytest.mark.parametrize("output_format", ["numpy", "arrow", "dict", "torch"])
def test_output_formats(catalog: Catalog, events: str, output_format: str) -> None:
    load, _ = loader(catalog, events, columns=["id", "x"], output_format=output_format)
    assert sorted(flat(batch_ids(load))) == list(range(ROWS))


def test_columns_select_and_order(catalog: Catalog, events: str) -> None:
    load, dataset = loader(catalog, events, columns=["name", "id"], output_format="arrow")
    assert dataset.plan.schema.names == ["name", "id"]
    batch = next(iter(load))
    assert batch.schema.names == ["name", "id"]


def test_an_empty_table_yields_no_batch(catalog: Catalog) -> None:
    catalog.create("empty")
    load, dataset = loader(catalog, "empty")
    assert dataset.snapshot_id is None
    assert batch_ids(load) == [] and len(load) == 0


def test_create_dataloader_returns_the_iceberg_dataset(catalog: Catalog, events: str) -> None:
    load, dataset = loader(catalog, events)
    assert isinstance(dataset, IcebergDataset) and load.dataset is dataset
    assert dataset.table == "db.events"
    assert dataset.snapshot_id == catalog.load(events).current_snapshot().snapshot_id


def test_ranks_that_receive_the_plan_never_touch_the_catalog(catalog: Catalog, events: str) -> None:
    """Under torch.distributed rank 0 plans and broadcasts (pickles) the plan: the other ranks
    build their filesystem and read from it alone, with no catalog access of their own."""
    from torch_dataloader_utils.dataset.tables import plan_table
    from torch_dataloader_utils.fs import FileSystemSpec

    source = Source(table="db.events", catalog_config=catalog.config, filters="id < 1000")
    planned = plan_table(source, FileSystemSpec("file"))
    received = pickle.dumps(planned)  # the source's plan, as rank 0 broadcasts it

    class Received:  # rank 1's `Spread`: rank 0's plan arrives; make() is never called
        active = True

        def __init__(self, *, explicit: bool) -> None:
            pass

        def from_rank0(self, make: object) -> object:
            return pickle.loads(received)

    unreachable = {"name": "nowhere", "type": "sql", "uri": "sqlite:////nonexistent/dir/x.db"}
    with mock.patch("torch_dataloader_utils.sources.planned.Spread", Received):
        load, dataset = IcebergDataset.create_dataloader(
            table="db.events",
            catalog_config=unreachable,
            filters="id < 1000",
            rank=1,
            world_size=2,
            batch_size=64,
            num_workers=2,
            multiprocessing_context="fork",
            timeout=60,
        )
    assert dataset.plan.fingerprint == planned.plan.fingerprint
    ids = flat(batch_ids(load))
    assert len(ids) == 500 and set(ids) < set(range(1000))


def test_clear_errors_for_bad_arguments(catalog: Catalog, events: str) -> None:
    with pytest.raises(StorageNotFoundError, match=r"table db\.nope does not exist"):
        loader(catalog, "nope")
    with pytest.raises(InvalidArgumentError, match="catalog_config"):
        IcebergDataset.create_dataloader(table="db.events", catalog_config={"type": "nope"})
    with pytest.raises(InvalidArgumentError, match="catalog_config must be a mapping"):
        IcebergDataset.create_dataloader(table="db.events", catalog_config="sqlite:///x")
    with pytest.raises(InvalidArgumentError, match='format="iceberg" only'):
        loader(catalog, events, format="parquet")
    with pytest.raises(InvalidArgumentError, match="partitioning"):
        loader(catalog, events, partitioning="hive")
    with pytest.raises(InvalidArgumentError, match="table must be a name"):
        IcebergDataset.create_dataloader(table="db..events", catalog_config=catalog.config)
    with pytest.raises(InvalidArgumentError, match="pass the table"):
        IcebergDataset.create_dataloader(catalog_config=catalog.config)


def test_the_first_block_is_decoded_in_its_own_batches(
    catalog: Catalog, quick_batches: QuickBatches
) -> None:
    """The table's format passes the first block's rows on to its Parquet reads
    (`Format.quick_start`): the first row group is decoded in batches of that size, and the
    rows come in the same order as without."""
    catalog.create("quick", [range(1000)])

    def order() -> list[int]:
        load, _ = loader(catalog, "quick", shuffle=True, shuffle_block_size=32, batch_size=16)
        ids = flat(batch_ids(load))
        assert Counter(ids) == Counter(range(1000))
        return ids

    quick = order()
    assert any(quick_batches.taken)
    quick_batches.never()
    assert order() == quick and not any(quick_batches.taken)
