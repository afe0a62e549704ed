"""Real DataLoader worker processes (fork and spawn): every row exactly once per epoch.

Each epoch's batches are checked against the reference model (docs/concepts/model.md) with one
reader (world size 1): the rank reads one global row order, cut into contiguous, batch-aligned
worker streams whose batch counts differ by at most one. The global order of a shuffled epoch
comes from the dataset's own single-stream assignment, mapped to ids with pyarrow directly; the
cut into workers is re-derived here. Without shuffling the global order is simply every id
ascending. Workers are real processes, so every test has a timeout.
"""

from __future__ import annotations

import ctypes
import functools
import gc
import os
import sys
from collections import Counter
from collections.abc import Sequence
from functools import cache
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch
from torch.utils.data import DataLoader

import torch_dataloader_utils as tdu
from tests.conftest import first_error
from torch_dataloader_utils import Topology

pytestmark = [
    pytest.mark.timeout(120),
    pytest.mark.filterwarnings("ignore:This DataLoader will create:UserWarning"),
    pytest.mark.filterwarnings("ignore:.*pin_memory.*:UserWarning"),
]

# 1600 rows in 5 files (one without rows), 100-row row groups: 60-row batches leave a short one.
SIZES = (250, 1000, 0, 333, 17)
ROWS = sum(SIZES)
BATCH = 60
SEED = 7
EPOCHS = 3

Batches = list[list[int]]


# --- the oracle ------------------------------------------------------------------------------


@cache
def _chunk_ids(path: str, start: int, stop: int) -> tuple[int, ...]:
    """Ids of row groups ``[start, stop)`` of ``path``, read with pyarrow alone."""
    table = pq.ParquetFile(path).read_row_groups(list(range(start, stop)), columns=["id"])
    return tuple(table["id"].to_pylist())


def global_order(dataset: tdu.StructuredDataset, epoch: int) -> list[int]:
    """The ids of the rank's global row sequence of ``epoch``, before row shuffling."""
    order: list[int] = []
    for piece in dataset.pieces(Topology(), epoch):  # one reader: one stream is everything
        chunk = dataset.plan.chunks[piece.chunk]
        order.extend(_chunk_ids(chunk.path, chunk.start, chunk.stop)[piece.start : piece.stop])
    if not dataset.shuffle:
        full = list(range(ROWS))
        assert order == full[: len(order)]  # canonical order: files sorted, ids ascending
    return order


def worker_streams(order: Sequence[int], *, batch_size: int, num_workers: int) -> list[list[int]]:
    """Cut the rank's rows into contiguous, batch-aligned streams, batch counts equal +-1."""
    num_batches = -(-len(order) // batch_size)
    base, extra = divmod(num_batches, num_workers)
    streams, first = [], 0
    for worker in range(num_workers):
        count = base + (worker < extra)
        streams.append(list(order[first * batch_size : (first + count) * batch_size]))
        first += count
    return streams


def read_epoch(loader: Any) -> Batches:
    """The ids of every batch the loader yields in one epoch, in order."""
    return [batch["id"].tolist() for batch in loader]


def split_by_stream(batches: Batches, streams: Sequence[Sequence[int]]) -> list[Batches]:
    """Give every batch to the stream its ids belong to; a batch never mixes streams."""
    owner = {i: w for w, stream in enumerate(streams) for i in stream}
    got: list[Batches] = [[] for _ in streams]
    for batch in batches:
        owners = {owner.get(i, -1) for i in batch}
        assert len(owners) == 1 and -1 not in owners, f"batch mixes streams: {owners}"
        got[owners.pop()].append(batch)
    return got


def check_epoch(
    batches: Batches, dataset: tdu.StructuredDataset, *, epoch: int, num_workers: int
) -> None:
    """Every id once; each worker's batches are exactly its stream; at most one short batch."""
    order = global_order(dataset, epoch)
    flat = [i for batch in batches for i in batch]
    assert Counter(flat) == Counter(order)
    if not dataset.drop_last:
        assert Counter(flat) == Counter(range(ROWS))
    streams = worker_streams(order, batch_size=dataset.batch_size, num_workers=num_workers)
    for stream, got in zip(streams, split_by_stream(batches, streams), strict=True):
        sizes = [len(b) for b in got]
        assert all(n == dataset.batch_size for n in sizes[:-1]), sizes
        ids = [i for batch in got for i in batch]
        if dataset.shuffle:
            assert Counter(ids) == Counter(stream)
        else:
            assert ids == stream  # in stream order: ascending, contiguous
    short = [len(b) for b in batches if len(b) != dataset.batch_size]
    assert len(short) <= (0 if dataset.drop_last else 1), short
    assert all(n > 0 for n in short)


def make_loader(root: Path, **options: Any) -> tdu.TabularDataLoader:
    options.setdefault("batch_size", BATCH)
    options.setdefault("shuffle_seed", SEED)
    if options.get("num_workers"):
        options.setdefault("multiprocessing_context", "fork")
        options.setdefault("timeout", 60)  # a stuck worker raises instead of hanging the run
    return tdu.create_dataloader(root, format="parquet", **options)


def run_epochs(loader: tdu.TabularDataLoader, epochs: Sequence[int]) -> list[Batches]:
    out = []
    for epoch in epochs:
        loader.set_epoch(epoch)
        out.append(read_epoch(loader))
    return out


def flat(batches: Batches) -> list[int]:
    return [i for batch in batches for i in batch]


def _record_worker(directory: str, worker_id: int) -> None:
    """A user ``worker_init_fn`` (module level, so spawn can pickle it): leaves a marker file."""
    info = torch.utils.data.get_worker_info()
    assert info is not None and info.id == worker_id
    Path(directory, f"{os.getpid()}-{worker_id}").touch()


@pytest.fixture
def source(parquet_dir: Any) -> Path:
    root, rows = parquet_dir(SIZES)
    assert rows == ROWS
    return root


# --- fork: every topology, persistent or not, three epochs ----------------------------------

FORK_CASES = [(k, False) for k in range(5)] + [(k, True) for k in range(1, 5)]


@pytest.mark.parametrize(("num_workers", "persistent"), FORK_CASES)
def test_fork_shuffled_epochs_read_every_row_once(
    source: Path, num_workers: int, persistent: bool
) -> None:
    loader = make_loader(
        source, num_workers=num_workers, shuffle=True, persistent_workers=persistent
    )
    epochs = run_epochs(loader, range(EPOCHS))
    for epoch, batches in enumerate(epochs):
        check_epoch(batches, loader.dataset, epoch=epoch, num_workers=max(num_workers, 1))
        assert len(batches) == len(loader) == -(-ROWS // BATCH)
    orders = [flat(b) for b in epochs]
    assert orders[0] != orders[1] and orders[1] != orders[2] and orders[0] != orders[2]


@pytest.mark.parametrize("num_workers", range(1, 5))
@pytest.mark.parametrize("drop_last", [False, True])
def test_fork_unshuffled_streams_are_ascending_and_contiguous(
    source: Path, num_workers: int, drop_last: bool
) -> None:
    # 120-row bundles: each worker sends several messages, so their interleaving is exercised.
    loader = make_loader(
        source, num_workers=num_workers, shuffle=False, drop_last=drop_last, bundle_rows=120
    )
    first, second = run_epochs(loader, range(2))
    check_epoch(first, loader.dataset, epoch=0, num_workers=num_workers)
    assert second == first  # no shuffle: every epoch alike
    assert len(first) == len(loader)
    if drop_last:
        assert all(len(b) == BATCH for b in first)
        assert sorted(flat(first)) == list(range(ROWS - ROWS % BATCH))


def test_shuffle_is_deterministic_per_seed_and_epoch(source: Path) -> None:
    one = make_loader(source, num_workers=2, shuffle=True)
    two = make_loader(source, num_workers=2, shuffle=True)
    other_seed = make_loader(source, num_workers=2, shuffle=True, shuffle_seed=SEED + 1)
    a, b, c = (run_epochs(loader, [0, 1]) for loader in (one, two, other_seed))
    assert a == b  # same seed, same epochs: the same batches in the same order
    assert flat(a[0]) != flat(c[0]) and flat(a[1]) != flat(c[1])
    for epochs in (a, c):
        assert Counter(flat(epochs[0])) == Counter(flat(epochs[1])) == Counter(range(ROWS))
    # rows are shuffled, not only chunks: some batch is not a run of consecutive ids
    assert any(batch != list(range(batch[0], batch[0] + len(batch))) for batch in a[0])


@pytest.mark.parametrize("num_workers", [1, 2, 4])
def test_set_epoch_reaches_persistent_workers(source: Path, num_workers: int) -> None:
    persistent = make_loader(source, num_workers=num_workers, shuffle=True, persistent_workers=True)
    e0, e1, e0_again = run_epochs(persistent, [0, 1, 0])
    assert flat(e1) != flat(e0)
    assert e0_again == e0
    fresh = make_loader(source, num_workers=num_workers, shuffle=True)
    fresh.set_epoch(1)
    assert read_epoch(fresh) == e1  # the persistent workers saw epoch 1, not their start epoch
    check_epoch(e1, persistent.dataset, epoch=1, num_workers=num_workers)


def test_dataset_set_epoch_is_the_loader_set_epoch(source: Path) -> None:
    loader = make_loader(source, num_workers=2, shuffle=True, persistent_workers=True)
    loader.dataset.set_epoch(2)  # the seed API: dataset.set_epoch
    via_dataset = read_epoch(loader)
    assert loader.dataset.epoch == 2
    loader.set_epoch(2)
    assert read_epoch(loader) == via_dataset
    check_epoch(via_dataset, loader.dataset, epoch=2, num_workers=2)


# --- a dataset built once, read by plain DataLoaders of any size -----------------------------


@pytest.mark.parametrize("num_workers", [1, 2, 4])
def test_plain_dataloader_resolves_streams_in_the_workers(source: Path, num_workers: int) -> None:
    dataset = tdu.StructuredDataset(
        source, "parquet", batch_size=BATCH, shuffle=True, shuffle_seed=SEED
    )
    loader = DataLoader(
        dataset, batch_size=None, num_workers=num_workers, multiprocessing_context="fork"
    )
    for epoch in range(2):
        dataset.set_epoch(epoch)
        batches = read_epoch(loader)
        check_epoch(batches, dataset, epoch=epoch, num_workers=num_workers)
        assert len(batches) == len(dataset)


def test_constructor_workers_do_not_freeze_the_assignment(source: Path) -> None:
    built_for_four = make_loader(source, num_workers=4, shuffle=True)
    dataset = built_for_four.dataset
    dataset.set_epoch(1)
    fewer = DataLoader(dataset, batch_size=None, num_workers=2, multiprocessing_context="fork")
    check_epoch(read_epoch(fewer), dataset, epoch=1, num_workers=2)
    in_process = [batch["id"].tolist() for batch in dataset]
    check_epoch(in_process, dataset, epoch=1, num_workers=1)


# --- the bundled transport -------------------------------------------------------------------


@pytest.mark.parametrize("num_workers", [2, 3])
def test_bundling_keeps_every_stream_and_batch(source: Path, num_workers: int) -> None:
    runs = {
        rows: make_loader(source, num_workers=num_workers, shuffle=True, bundle_rows=rows)
        for rows in (0, 120, tdu.loader.DEFAULT_BUNDLE_ROWS)
    }
    order = global_order(runs[0].dataset, 0)
    streams = worker_streams(order, batch_size=BATCH, num_workers=num_workers)
    per_stream = {}
    for rows, loader in runs.items():
        batches = read_epoch(loader)
        check_epoch(batches, loader.dataset, epoch=0, num_workers=num_workers)
        per_stream[rows] = split_by_stream(batches, streams)
    assert per_stream[0] == per_stream[120] == per_stream[tdu.loader.DEFAULT_BUNDLE_ROWS]


def test_bundling_gives_the_identical_sequence_with_one_worker(source: Path) -> None:
    sequences = [
        read_epoch(make_loader(source, num_workers=1, shuffle=True, bundle_rows=rows))
        for rows in (0, 120, tdu.loader.DEFAULT_BUNDLE_ROWS)
    ]
    assert sequences[0] == sequences[1] == sequences[2]
    assert Counter(flat(sequences[0])) == Counter(range(ROWS))


@pytest.mark.parametrize("num_workers", [2, 3])
def test_bundled_order_is_deterministic_and_interleaves_workers_by_bundle(
    source: Path, num_workers: int
) -> None:
    # Bundling changes how workers interleave (by message, not by batch); the order is still a
    # pure function of the plan, topology, seed and epoch.
    plain = read_epoch(make_loader(source, num_workers=num_workers, shuffle=True, bundle_rows=0))
    bundled = read_epoch(make_loader(source, num_workers=num_workers, shuffle=True))
    again = read_epoch(make_loader(source, num_workers=num_workers, shuffle=True))
    assert Counter(flat(plain)) == Counter(flat(bundled)) == Counter(range(ROWS))
    assert bundled == again
    assert sorted(bundled) == sorted(plain)  # the same batches


@pytest.mark.parametrize("output_format", ["numpy", "arrow", "dict"])
def test_other_outputs_cross_from_workers(source: Path, output_format: str) -> None:
    loader = make_loader(source, num_workers=2, shuffle=True, output_format=output_format)
    reference = read_epoch(make_loader(source, num_workers=2, shuffle=True))

    def ids(batch: Any) -> list[int]:
        column = batch.column("id") if output_format == "arrow" else batch["id"]
        return list(column.to_pylist() if output_format == "arrow" else list(column))

    batches = [[int(i) for i in ids(batch)] for batch in loader]
    check_epoch(batches, loader.dataset, epoch=0, num_workers=2)
    assert batches == reference  # the same batches, in the same order, as torch output


def test_pin_memory_works_without_an_accelerator(source: Path) -> None:
    loader = make_loader(source, num_workers=2, shuffle=True, pin_memory=True)
    batches = []
    for batch in loader:
        assert isinstance(batch["id"], torch.Tensor) and batch["emb"].shape[1:] == (4,)
        batches.append(batch["id"].tolist())
    check_epoch(batches, loader.dataset, epoch=0, num_workers=2)


def test_user_worker_init_fn_runs_in_every_worker(source: Path, tmp_path: Path) -> None:
    marks = tmp_path / "marks"
    marks.mkdir()
    init = functools.partial(_record_worker, str(marks))
    loader = make_loader(source, num_workers=3, shuffle=True, worker_init_fn=init)
    check_epoch(read_epoch(loader), loader.dataset, epoch=0, num_workers=3)
    assert sorted(int(p.name.split("-")[1]) for p in marks.iterdir()) == [0, 1, 2]


def _count_frozen(marks: str, worker_id: int) -> None:
    Path(marks, f"worker-{worker_id}-{gc.get_freeze_count()}").touch()


def test_a_worker_freezes_its_start_up_objects_out_of_collections(
    source: Path, tmp_path: Path
) -> None:
    # (A spawned worker's full collections walked them all: docs/adr/0016, spawned workers.)
    marks = tmp_path / "marks"
    marks.mkdir()
    init = functools.partial(_count_frozen, str(marks))
    loader = make_loader(source, num_workers=2, shuffle=True, worker_init_fn=init)
    check_epoch(read_epoch(loader), loader.dataset, epoch=0, num_workers=2)
    frozen = [int(p.name.split("-")[2]) for p in marks.iterdir()]
    assert len(frozen) == 2 and min(frozen) > 10_000


def _huge_pages_mark(marks: str, worker_id: int) -> None:
    libc = ctypes.CDLL("libc.so.6", use_errno=True)
    Path(marks, f"worker-{worker_id}-{libc.prctl(42, 0, 0, 0, 0)}").touch()  # PR_GET_THP_DISABLE


@pytest.mark.skipif(sys.platform != "linux", reason="transparent huge pages are Linux's")
@pytest.mark.parametrize("context", ["fork", "spawn"])
def test_a_worker_keeps_the_systems_transparent_huge_pages(
    source: Path, tmp_path: Path, context: str
) -> None:
    # (Turned off in workers they cost 11-20% more CPU a row: docs/adr/0036.) A worker's
    # setting is its parent's, as the system left it.
    marks = tmp_path / "marks"
    marks.mkdir()
    init = functools.partial(_huge_pages_mark, str(marks))
    loader = make_loader(
        source, num_workers=2, shuffle=True, worker_init_fn=init, multiprocessing_context=context
    )
    check_epoch(read_epoch(loader), loader.dataset, epoch=0, num_workers=2)
    parent = ctypes.CDLL("libc.so.6").prctl(42, 0, 0, 0, 0)
    assert sorted(p.name for p in marks.iterdir()) == [f"worker-0-{parent}", f"worker-1-{parent}"]


# --- errors in workers reach the main process, typed and naming the file ---------------------


def corrupt_row_group(path: Path, row_group: int) -> None:
    """Overwrite every column chunk of one row group with garbage; the footer stays valid."""
    metadata = pq.ParquetFile(path).metadata.row_group(row_group)
    with path.open("r+b") as f:
        for j in range(metadata.num_columns):
            column = metadata.column(j)
            start = column.dictionary_page_offset or column.data_page_offset
            f.seek(start)
            f.write(b"\xff" * column.total_compressed_size)


VICTIM = "part-001.parquet"  # ids 250..1249: read by worker 0 and worker 1 in canonical order


@pytest.mark.parametrize("num_workers", [0, 2])
def test_a_file_deleted_after_planning_raises_storage_not_found(
    source: Path, num_workers: int
) -> None:
    loader = make_loader(source, num_workers=num_workers)
    (source / VICTIM).unlink()
    error = first_error(loader)
    assert isinstance(error, tdu.StorageNotFoundError) and isinstance(error, FileNotFoundError)
    assert str(source / VICTIM) in str(error)


@pytest.mark.parametrize("num_workers", [0, 2])
def test_a_corrupt_page_raises_corrupt_file_error_naming_the_file(
    source: Path, num_workers: int
) -> None:
    # the footer is intact, so planning cannot see the damage: only the worker reading it can
    corrupt_row_group(source / VICTIM, 5)
    loader = make_loader(source, num_workers=num_workers, shuffle=True)
    error = first_error(loader)
    assert isinstance(error, tdu.CorruptFileError) and isinstance(error, ValueError), type(error)
    assert f"{source / VICTIM} row group 5" in str(error)


def test_a_worker_error_does_not_stop_a_later_epoch_from_failing_again(source: Path) -> None:
    loader = make_loader(source, num_workers=2, persistent_workers=True)
    assert Counter(flat(read_epoch(loader))) == Counter(range(ROWS))
    (source / VICTIM).unlink()
    for epoch in (1, 2):
        loader.set_epoch(epoch)
        assert isinstance(first_error(loader), tdu.StorageNotFoundError)


# --- spawn: everything crosses by pickle -----------------------------------------------------


@pytest.mark.slow
def test_spawn_two_workers_two_epochs(source: Path, tmp_path: Path) -> None:
    marks = tmp_path / "marks"
    marks.mkdir()
    loader = make_loader(
        source,
        num_workers=2,
        shuffle=True,
        multiprocessing_context="spawn",
        worker_init_fn=functools.partial(_record_worker, str(marks)),
    )
    epochs = run_epochs(loader, range(2))  # (two: each spawns 2 workers, ~3.5 s apiece)
    for epoch, batches in enumerate(epochs):
        check_epoch(batches, loader.dataset, epoch=epoch, num_workers=2)
    assert len({tuple(flat(b)) for b in epochs}) == 2
    workers = sorted(int(p.name.split("-")[1]) for p in marks.iterdir())
    assert workers == [0, 0, 1, 1]  # fresh workers every epoch, each ran the init fn
    fork = make_loader(source, num_workers=2, shuffle=True)
    assert run_epochs(fork, range(2)) == epochs  # same order whatever the start method


@pytest.mark.slow
def test_spawn_persistent_workers_follow_set_epoch(source: Path) -> None:
    loader = make_loader(
        source,
        num_workers=3,
        shuffle=True,
        persistent_workers=True,
        multiprocessing_context="spawn",
        output_format="torch",
        columns=["id", "x", "emb", "tokens"],
    )
    epochs = run_epochs(loader, range(EPOCHS))
    for epoch, batches in enumerate(epochs):
        check_epoch(batches, loader.dataset, epoch=epoch, num_workers=3)
    assert len({tuple(flat(b)) for b in epochs}) == EPOCHS
    fork = make_loader(source, num_workers=3, shuffle=True, columns=["id", "x", "emb", "tokens"])
    fork.set_epoch(2)
    assert read_epoch(fork) == epochs[2]


@pytest.mark.slow
def test_spawn_values_match_the_ids(source: Path) -> None:
    loader = make_loader(source, num_workers=2, multiprocessing_context="spawn")
    seen = []
    for batch in loader:
        ids = batch["id"].numpy()
        np.testing.assert_array_equal(batch["x"].numpy(), (ids * 0.5).astype(np.float32))
        np.testing.assert_array_equal(batch["label"].numpy(), ids % 7)
        assert batch["name"] == [f"row-{i}" for i in ids]
        seen.extend(ids.tolist())
    assert Counter(seen) == Counter(range(ROWS))
