"""``ParquetFormat.read`` on a non-local filesystem (fsspec's ``memory://``): footers cached,
row groups fetched as byte ranges ahead of decoding, ``prefetch``, and the head-only stream.

Every remote read is compared with a local read of the same bytes.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import pickle
import threading
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import fsspec
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import torch_dataloader_utils as tdu
from tests.conftest import make_table
from torch_dataloader_utils.errors import StorageNotFoundError
from torch_dataloader_utils.formats import Listing, ReadOptions
from torch_dataloader_utils.formats.parquet import ParquetFormat
from torch_dataloader_utils.formats.parquet import format as parquet_module
from torch_dataloader_utils.fs import FileSystemSpec, list_files, ranges, threads
from torch_dataloader_utils.planning import Chunk

# file name -> (first id, rows, row group size)
LAYOUT = {
    "a.parquet": (0, 1000, 250),
    "b.parquet": (1000, 1000, 250),
    "c.parquet": (2000, 20_000, 20_000),  # one big row group: for the head-only stream
}


class RecordingSpec(FileSystemSpec):
    """A real spec that records each range request and the thread that made it (fetch threads
    are named ``tdu-fetch``; anything else is a fallback read from the decoder)."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.calls: list[tuple[str, int, int, str]] = []
        self.calls_lock = threading.Lock()

    def read_range(self, path: str, offset: int, size: int) -> bytes:
        with self.calls_lock:
            self.calls.append((path, offset, size, threading.current_thread().name))
        return super().read_range(path, offset, size)

    def fallbacks(self) -> list[tuple[str, int, int, str]]:
        return [c for c in self.calls if not c[3].startswith("tdu-fetch")]


@dataclasses.dataclass
class Store:
    root: str  # on the memory filesystem
    local: Path  # the same files on disk

    def remote_path(self, name: str) -> str:
        return f"{self.root}/{name}"

    def local_path(self, name: str) -> str:
        return str(self.local / name)


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    root = f"/tdu-remote-{uuid.uuid4().hex}"
    mem = fsspec.filesystem("memory")
    local = tmp_path / "local"
    local.mkdir()
    for name, (first, rows, rg_rows) in LAYOUT.items():
        path = local / name
        pq.write_table(make_table(np.arange(first, first + rows)), path, row_group_size=rg_rows)
        mem.pipe(f"{root}/{name}", path.read_bytes())
    yield Store(root, local)
    mem.rm(root, recursive=True)


def plan_remote(
    store: Store, options: ReadOptions, names: tuple[str, ...] = ("a.parquet", "b.parquet")
) -> tuple[list[Chunk], RecordingSpec]:
    fs = RecordingSpec("memory")
    files = list_files([f"memory://{store.remote_path(n)}" for n in names], fs)
    plan = ParquetFormat().plan(Listing.of(files), fs, options)
    return plan.chunks, fs


def read_table(
    fmt: ParquetFormat,
    chunk: Chunk,
    start: int,
    stop: int,
    fs: FileSystemSpec,
    options: ReadOptions,
) -> pa.Table:
    batches = list(fmt.read(chunk, start, stop, fs, options))
    assert all(isinstance(b, pa.RecordBatch) for b in batches)
    return pa.Table.from_batches(batches) if batches else pa.table({})


def local_table(
    store: Store, chunk: Chunk, start: int, stop: int, options: ReadOptions
) -> pa.Table:
    """The same rows read through the local path, from the same bytes on disk."""
    local = dataclasses.replace(chunk, path=store.local_path(os.path.basename(chunk.path)))
    fmt = ParquetFormat()
    try:
        return read_table(fmt, local, start, stop, FileSystemSpec("file"), options)
    finally:
        fmt.close()


def ids(table: pa.Table) -> list[int]:
    return table.column("id").to_pylist()


def chunk_start(column: pq.ColumnChunkMetaData) -> int:
    """Where a column chunk's bytes begin (its dictionary page, when it has one)."""
    start = column.data_page_offset
    if column.has_dictionary_page:
        start = min(start, column.dictionary_page_offset)
    return start


# --- full reads --------------------------------------------------------------------------------


@pytest.mark.parametrize("split_rows", [None, 500, 1000])
def test_full_reads_give_every_row_exactly_once(store: Store, split_rows: int | None) -> None:
    options = ReadOptions(split_rows=split_rows)
    chunks, fs = plan_remote(store, options)
    assert len(chunks) == 2000 // (split_rows or 250)
    fmt = ParquetFormat()
    seen: Counter[int] = Counter()
    try:
        for chunk in chunks:
            remote = read_table(fmt, chunk, 0, chunk.num_rows, fs, options)
            assert remote.equals(local_table(store, chunk, 0, chunk.num_rows, options))
            seen.update(ids(remote))
    finally:
        fmt.close()
    assert seen == Counter(range(2000))
    assert fs.calls, "the remote path fetched byte ranges"
    assert fs.fallbacks() == []  # all bytes came from the ahead-of-decoding fetches
    assert all(name.startswith("tdu-fetch") for *_, name in fs.calls)


def test_every_row_group_is_fetched_once_within_a_chunk(store: Store) -> None:
    options = ReadOptions(split_rows=1000)  # one chunk per file, four row groups each
    chunks, fs = plan_remote(store, options)
    fmt = ParquetFormat()
    try:
        for chunk in chunks:
            assert chunk.unit_rows == (250,) * 4
            assert len(read_table(fmt, chunk, 0, chunk.num_rows, fs, options)) == 1000
    finally:
        fmt.close()
    requests = Counter((path, offset, size) for path, offset, size, _ in fs.calls)
    assert max(requests.values()) == 1
    assert len({(path, offset) for path, offset, _ in requests}) == 8  # 2 files x 4 groups


# --- row ranges --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("start", "stop"),
    [(0, 1000), (100, 600), (249, 251), (250, 500), (500, 750), (999, 1000), (0, 1), (730, 990)],
)
def test_partial_row_ranges_across_row_groups(store: Store, start: int, stop: int) -> None:
    options = ReadOptions(split_rows=1000)
    chunks, fs = plan_remote(store, options)
    chunk = chunks[1]  # b.parquet: ids 1000..1999 in four row groups of 250
    fmt = ParquetFormat()
    try:
        remote = read_table(fmt, chunk, start, stop, fs, options)
    finally:
        fmt.close()
    assert ids(remote) == list(range(1000 + start, 1000 + stop))
    assert remote.equals(local_table(store, chunk, start, stop, options))
    # Only the row groups the range touches are requested.
    touched = {rg for rg in range(4) if rg * 250 < stop and start < (rg + 1) * 250}
    md = pq.read_metadata(store.local_path("b.parquet"))
    starts = {chunk_start(md.row_group(rg).column(0)) for rg in touched}
    fetched = {offset for _, offset, _, _ in fs.calls}
    head = start == 0 and stop * 8 <= 250  # a few first rows are streamed, not fetched
    assert fetched == (set() if head else starts)


# --- projection --------------------------------------------------------------------------------


def test_projection_fetches_only_the_projected_column_chunks(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    # No hole filling: each column chunk is its own request, so the bytes asked are visible.
    monkeypatch.setattr(ranges, "coalesce", functools.partial(ranges.coalesce, hole=-1))
    options = ReadOptions(columns=("id", "tokens", "name"))
    chunks, fs = plan_remote(store, options, names=("a.parquet",))
    fmt = ParquetFormat()
    try:
        for chunk in chunks:
            remote = read_table(fmt, chunk, 0, chunk.num_rows, fs, options)
            assert remote.column_names == ["id", "tokens", "name"]  # as requested
            assert remote.equals(local_table(store, chunk, 0, chunk.num_rows, options))
    finally:
        fmt.close()
    md = pq.read_metadata(store.local_path("a.parquet"))
    expected = set()
    for rg in range(md.num_row_groups):
        group = md.row_group(rg)
        for j in range(group.num_columns):
            column = group.column(j)
            if column.path_in_schema.split(".")[0] in options.columns:  # type: ignore[operator]
                expected.add((chunk_start(column), column.total_compressed_size))
    assert {(offset, size) for _, offset, size, _ in fs.calls} == expected
    assert fs.fallbacks() == []  # the decoder needed no byte outside those ranges


# --- prefetch ----------------------------------------------------------------------------------


def test_prefetch_then_read_uses_the_prefetched_bytes(store: Store) -> None:
    options = ReadOptions()
    chunks, fs = plan_remote(store, options)
    fmt = ParquetFormat()
    try:
        chunk = chunks[5]  # b.parquet row group 1
        fmt.prefetch(chunk, 0, chunk.num_rows, fs, options)
        (future,) = fmt._ahead.values()
        future.result(timeout=10)
        fetched = list(fs.calls)
        assert fetched and all(name.startswith("tdu-fetch") for *_, name in fetched)
        remote = read_table(fmt, chunk, 0, chunk.num_rows, fs, options)
        assert fs.calls == fetched  # the read made no request of its own
        assert ids(remote) == list(range(1250, 1500))
        assert remote.equals(local_table(store, chunk, 0, chunk.num_rows, options))
        assert fmt._ahead == {}  # handed over, not kept
    finally:
        fmt.close()


def test_prefetch_is_a_no_op_for_head_reads_and_local_files(store: Store) -> None:
    options = ReadOptions()
    chunks, fs = plan_remote(store, options, names=("c.parquet",))
    fmt = ParquetFormat()
    try:
        (chunk,) = chunks
        fmt.prefetch(chunk, 0, 100, fs, options)  # a few first rows: streamed when read
        assert fmt._ahead == {} and fs.calls == []
        local = dataclasses.replace(chunk, path=store.local_path("c.parquet"))
        fmt.prefetch(local, 0, local.num_rows, FileSystemSpec("file"), options)
        assert fmt._ahead == {}
    finally:
        fmt.close()


# --- the head-only stream ----------------------------------------------------------------------


@pytest.mark.parametrize(("start", "stop"), [(0, 5), (0, 100), (0, 2500)])
def test_head_only_read_streams_without_range_fetches(store: Store, start: int, stop: int) -> None:
    options = ReadOptions()
    chunks, fs = plan_remote(store, options, names=("c.parquet",))
    (chunk,) = chunks
    assert chunk.unit_rows == (20_000,)
    fmt = ParquetFormat()
    try:
        remote = read_table(fmt, chunk, start, stop, fs, options)
        assert fs.calls == []  # streamed through the filesystem, no column chunk fetched
        assert fmt._ahead == {}
    finally:
        fmt.close()
    assert ids(remote) == list(range(2000 + start, 2000 + stop))
    assert remote.equals(local_table(store, chunk, start, stop, options))


@pytest.mark.parametrize(("start", "stop"), [(0, 2501), (1, 100), (19_990, 20_000)])
def test_other_reads_of_a_big_row_group_fetch_it(store: Store, start: int, stop: int) -> None:
    options = ReadOptions(columns=("id", "x"))
    chunks, fs = plan_remote(store, options, names=("c.parquet",))
    (chunk,) = chunks
    fmt = ParquetFormat()
    try:
        remote = read_table(fmt, chunk, start, stop, fs, options)
    finally:
        fmt.close()
    assert fs.calls and fs.fallbacks() == []
    assert ids(remote) == list(range(2000 + start, 2000 + stop))
    assert remote.equals(local_table(store, chunk, start, stop, options))


@pytest.mark.parametrize(("start", "stop"), [(0, 20_000), (1, 100), (19_990, 20_000), (0, 5)])
def test_row_groups_too_big_to_fetch_whole_are_streamed(
    store: Store, monkeypatch: pytest.MonkeyPatch, start: int, stop: int
) -> None:
    # A row group over _FETCH_BYTES is never held whole: pyarrow reads its pages through the
    # (retried) range reads as it decodes, and no fetch ahead is started for it.
    monkeypatch.setattr(parquet_module, "_FETCH_BYTES", 1024)
    options = ReadOptions()
    chunks, fs = plan_remote(store, options, names=("c.parquet",))
    (chunk,) = chunks
    fmt = ParquetFormat()
    try:
        fmt.prefetch(chunk, start, stop, fs, options)
        assert fmt._ahead == {} and fs.calls == []
        remote = read_table(fmt, chunk, start, stop, fs, options)
        assert fmt._ahead == {}
    finally:
        fmt.close()
    assert fs.calls and not any(name.startswith("tdu-fetch") for *_, name in fs.calls)
    assert ids(remote) == list(range(2000 + start, 2000 + stop))
    assert remote.equals(local_table(store, chunk, start, stop, options))


def test_head_only_boundary_is_an_eighth_of_the_row_group() -> None:
    assert parquet_module._HEAD_SHARE == 8
    assert parquet_module._head_only(0, 2500, 20_000)
    assert not parquet_module._head_only(0, 2501, 20_000)
    assert not parquet_module._head_only(1, 2, 20_000)


# --- footers, failures, lifecycle --------------------------------------------------------------


def test_footers_are_cached_per_file_and_bounded(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    options = ReadOptions()
    chunks, fs = plan_remote(store, options, names=("a.parquet", "b.parquet", "c.parquet"))
    fmt = ParquetFormat()
    opened: list[str] = []
    real_open = parquet_module.open_input

    def counting_open(path: str, spec: FileSystemSpec) -> pa.NativeFile:
        opened.append(path)
        return real_open(path, spec)

    monkeypatch.setattr(parquet_module, "open_input", counting_open)
    a, b, c = (store.remote_path(n) for n in ("a.parquet", "b.parquet", "c.parquet"))
    try:
        for chunk in chunks[:8]:  # the four row groups of a and of b
            read_table(fmt, chunk, 0, chunk.num_rows, fs, options)
        # One footer read per file, however many row groups were read from it.
        assert opened == [a, b]
        assert list(fmt._footers) == [a, b]
        monkeypatch.setattr(parquet_module, "_FOOTERS", 1)
        read_table(fmt, chunks[8], 0, 10, fs, options)  # c: its footer evicts the others
        assert list(fmt._footers) == [c]
        opened.clear()
        read_table(fmt, chunks[0], 0, 250, fs, options)  # a: its footer is read again
        assert opened == [a]
    finally:
        fmt.close()


def test_missing_object_raises_storage_not_found(store: Store) -> None:
    options = ReadOptions()
    chunks, fs = plan_remote(store, options)
    fsspec.filesystem("memory").rm(store.remote_path("b.parquet"))
    fmt = ParquetFormat()
    try:
        with pytest.raises(StorageNotFoundError, match=r"b\.parquet"):
            read_table(fmt, chunks[-1], 0, chunks[-1].num_rows, fs, options)
        # The other file still reads.
        assert len(read_table(fmt, chunks[0], 0, chunks[0].num_rows, fs, options)) == 250
    finally:
        fmt.close()


def test_close_then_reuse_and_pickle(store: Store) -> None:
    options = ReadOptions()
    chunks, fs = plan_remote(store, options)
    fmt = ParquetFormat()
    read_table(fmt, chunks[0], 0, 250, fs, options)
    fmt.prefetch(chunks[1], 0, 250, fs, options)
    assert fmt._fetcher is not None and fmt._footers
    copy = pickle.loads(pickle.dumps(fmt))
    assert copy._fetcher is None and not copy._footers and not copy._ahead
    fmt.close()
    fmt.close()
    assert fmt._fetcher is None and fmt._ahead == {}
    # Usable after close (a new fetcher is built).
    assert ids(read_table(fmt, chunks[2], 0, 250, fs, options)) == list(range(500, 750))
    assert ids(read_table(copy, chunks[3], 0, 250, fs, options)) == list(range(750, 1000))
    fmt.close()
    copy.close()


# --- through the loader ------------------------------------------------------------------------


def options_function(calls: list[int]) -> dict[str, str]:
    calls.append(os.getpid())
    return {}


def test_create_dataloader_reads_memory_with_an_options_function(store: Store) -> None:
    calls: list[int] = []
    loader = tdu.create_dataloader(
        f"memory://{store.root}",
        num_workers=0,
        batch_size=97,
        storage_options=functools.partial(options_function, calls),
        split_rows=500,
    )
    seen = Counter(i for batch in loader for i in batch["id"].tolist())
    assert seen == Counter(range(22_000))
    assert calls and set(calls) == {os.getpid()}


# --- fetch scheduling: no row group twice, the current one first -------------------------------


def test_hinted_row_group_is_not_fetched_twice(store: Store) -> None:
    options = ReadOptions(split_rows=500)  # chunks of two row groups
    chunks, fs = plan_remote(store, options)
    fmt = ParquetFormat()
    try:
        for k, chunk in enumerate(chunks):
            if k + 1 < len(chunks):  # as reading.Reader does: hint the next piece first
                fmt.prefetch(chunks[k + 1], 0, chunks[k + 1].num_rows, fs, options)
            read_table(fmt, chunk, 0, chunk.num_rows, fs, options)
        time.sleep(0.1)  # let cancelled-but-running parts finish
    finally:
        fmt.close()
    requests = Counter((path, offset, size) for path, offset, size, _ in fs.calls)
    assert max(requests.values()) == 1, requests


def test_current_row_group_is_requested_first(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(threads, "FETCH_THREADS", 1)  # one fetch thread: requests run in order
    options = ReadOptions(split_rows=1000)
    chunks, fs = plan_remote(store, options, names=("a.parquet",))
    fmt = ParquetFormat()
    try:
        read_table(fmt, chunks[0], 0, 1000, fs, options)
    finally:
        fmt.close()
    md = pq.read_metadata(store.local_path("a.parquet"))
    assert fs.calls[0][1] == chunk_start(md.row_group(0).column(0))


# --- fork safety -------------------------------------------------------------------------------


def test_a_forked_child_reads_with_its_own_fetch_threads(store: Store) -> None:
    # The parent is mid-read (its fetch threads and a fetch ahead exist) when a child forks:
    # the child must not wait on the parent's threads or futures.
    import multiprocessing

    options = ReadOptions(split_rows=1000)
    chunks, fs = plan_remote(store, options)
    fmt = ParquetFormat()
    batches = fmt.read(chunks[0], 0, chunks[0].num_rows, fs, options)
    next(batches)  # fetch threads started, the next row group in flight
    expected = local_table(store, chunks[1], 0, chunks[1].num_rows, options)

    def child(queue: multiprocessing.Queue[list[int]]) -> None:
        got = read_table(fmt, chunks[1], 0, chunks[1].num_rows, fs, options)
        queue.put(ids(got))

    context = multiprocessing.get_context("fork")
    queue: multiprocessing.Queue[list[int]] = context.Queue()
    process = context.Process(target=child, args=(queue,))
    process.start()
    try:
        assert queue.get(timeout=30) == ids(expected)
    finally:
        process.join(10)
        if process.is_alive():
            process.kill()
        batches.close()
        fmt.close()
