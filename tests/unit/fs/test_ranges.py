"""Byte ranges: coalescing, a file over fetched ranges (read by the Parquet reader), and the
concurrent fetcher."""

from __future__ import annotations

import io
import logging
import multiprocessing
import os
import pickle
import threading
from collections.abc import Iterator
from concurrent.futures import CancelledError
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests.conftest import make_table
from torch_dataloader_utils.fs import ranges, threads
from torch_dataloader_utils.fs.ranges import RangeFetcher, RangeFile, ReadsAhead, coalesce

# --- coalesce ----------------------------------------------------------------------------------


def test_coalesce_sorts_merges_and_drops_empty() -> None:
    assert coalesce([]) == []
    assert coalesce([(5, 0), (9, 0)]) == []
    assert coalesce([(100, 10), (0, 10)], hole=0) == [(0, 10), (100, 10)]
    # Adjacent, overlapping and contained ranges merge.
    assert coalesce([(0, 10), (10, 5)], hole=0) == [(0, 15)]
    assert coalesce([(0, 10), (5, 10)], hole=0) == [(0, 15)]
    assert coalesce([(0, 100), (10, 5)], hole=0) == [(0, 100)]
    # A gap of exactly ``hole`` bytes merges; one more byte does not.
    assert coalesce([(0, 10), (20, 5)], hole=10) == [(0, 25)]
    assert coalesce([(0, 10), (21, 5)], hole=10) == [(0, 10), (21, 5)]
    # Chains merge transitively, against the merged end.
    assert coalesce([(0, 10), (15, 10), (30, 10), (100, 1)], hole=5) == [(0, 40), (100, 1)]


def test_coalesce_default_hole_is_a_mebibyte() -> None:
    mib = 1 << 20
    assert mib == ranges.HOLE_BYTES
    assert coalesce([(0, 10), (10 + mib, 1)]) == [(0, 11 + mib)]
    assert coalesce([(0, 10), (11 + mib, 1)]) == [(0, 10), (11 + mib, 1)]


# --- RangeFile ---------------------------------------------------------------------------------

DATA = bytes(range(256)) * 8  # 2048 bytes, byte i == i % 256


class Recorder:
    """``fetch(offset, size)`` serving ``data``, recording each call."""

    def __init__(self, data: bytes) -> None:
        self.data = data
        self.calls: list[tuple[int, int]] = []

    def __call__(self, offset: int, size: int) -> bytes:
        self.calls.append((offset, size))
        return self.data[offset : offset + size]


def range_file(held: dict[int, bytes]) -> tuple[RangeFile, Recorder]:
    fetch = Recorder(DATA)
    return RangeFile(len(DATA), held, fetch), fetch


def test_read_inside_a_range_is_a_zero_copy_slice() -> None:
    block = DATA[100:600]
    f, fetch = range_file({100: block})
    f.seek(150)
    out = f.read(50)
    assert isinstance(out, memoryview)
    assert out.obj is block  # a view of the held buffer, not a copy
    assert bytes(out) == DATA[150:200]
    assert f.tell() == 200
    f.seek(100)
    assert bytes(f.read(500)) == block  # exactly the whole range
    assert fetch.calls == []


def test_read_outside_ranges_fetches_exactly_what_is_missing() -> None:
    f, fetch = range_file({100: DATA[100:200], 1000: DATA[1000:1100]})
    f.seek(10)
    assert f.read(20) == DATA[10:30]  # before any range
    f.seek(150)
    assert f.read(100) == DATA[150:250]  # starts inside a range, ends past it
    f.seek(190)
    assert f.read(900) == DATA[190:1090]  # spans a gap and the next range
    f.seek(1500)
    assert f.read(10) == DATA[1500:1510]  # after the last range
    assert fetch.calls == [(10, 20), (150, 100), (190, 900), (1500, 10)]


def test_reading_ahead_fetches_a_block_and_serves_the_reads_after_it() -> None:
    fetch = Recorder(DATA)
    f = RangeFile(len(DATA), {100: DATA[100:200]}, fetch, ahead=512)
    f.seek(10)
    assert bytes(f.read(20)) == DATA[10:30]  # fetches [10, 522)
    f.seek(300)
    assert bytes(f.read(200)) == DATA[300:500]  # inside that block: no request
    f.seek(150)
    assert bytes(f.read(10)) == DATA[150:160]  # a held range comes first
    f.seek(500)
    assert bytes(f.read(100)) == DATA[500:600]  # past the block: a new one, from 500
    f.seek(1900)
    assert bytes(f.read(1000)) == DATA[1900:]  # capped at the end of the file
    f.seek(0)
    assert bytes(f.read(1024)) == DATA[:1024]  # a read longer than a block: what it asks
    assert fetch.calls == [(10, 512), (500, 512), (1900, 148), (0, 1024)]


def test_seek_whence_tell_and_eof() -> None:
    f, fetch = range_file({0: DATA})
    assert f.readable() and f.seekable()
    assert f.seek(10) == 10 and f.tell() == 10
    assert f.seek(5, io.SEEK_CUR) == 15
    assert f.seek(-8, io.SEEK_END) == len(DATA) - 8
    assert bytes(f.read(100)) == DATA[-8:]  # truncated at the end
    assert f.tell() == len(DATA)
    assert f.read(1) == b""  # EOF
    assert f.read() == b""
    f.seek(len(DATA) + 50)  # past the end: reads nothing
    assert f.read(10) == b""
    assert f.seek(-100) == 0  # clamped at the start
    assert bytes(f.read()) == DATA  # read() / read(-1) / read(None): to the end
    f.seek(2000)
    assert bytes(f.read(None)) == DATA[2000:]  # type: ignore[arg-type]
    f.seek(0)
    assert f.read(0) == b""
    assert fetch.calls == []


def test_readinto_and_python_io_helpers() -> None:
    f, fetch = range_file({0: DATA[:1024]})
    buffer = bytearray(16)
    assert f.readinto(memoryview(buffer)) == 16
    assert bytes(buffer) == DATA[:16]
    f.seek(len(DATA) - 4)
    buffer = bytearray(16)
    assert f.readinto(memoryview(buffer)) == 4  # short at EOF
    assert bytes(buffer[:4]) == DATA[-4:]
    f.seek(1020)
    assert f.readall() == DATA[1020:]  # io.RawIOBase.readall, through read()
    # The last 4 bytes and the tail from 1020 are outside the held first KiB.
    assert fetch.calls == [(len(DATA) - 4, 4), (1020, len(DATA) - 1020)]


def test_arrow_input_file() -> None:
    f, fetch = range_file({0: DATA[:512], 1024: DATA[1024:]})
    source = f.arrow()
    assert isinstance(source, pa.PythonFile)
    assert source.size() == len(DATA)
    assert source.read_at(100, 200) == DATA[200:300]
    assert source.read_at(100, 1500) == DATA[1500:1600]
    assert fetch.calls == []
    assert source.read_at(100, 500) == DATA[500:600]  # crosses a gap
    assert fetch.calls == [(500, 100)]


def write_parquet_file(tmp_path: Path) -> tuple[bytes, pq.FileMetaData, pa.Table]:
    table = make_table(np.arange(3000))
    path = tmp_path / "t.parquet"
    pq.write_table(table, path, row_group_size=1000)
    data = path.read_bytes()
    return data, pq.read_metadata(path), table


def column_chunk_ranges(
    md: pq.FileMetaData, rg: int, columns: set[str] | None
) -> list[tuple[int, int]]:
    """The bytes of row group ``rg``'s column chunks of ``columns`` (top-level names)."""
    group = md.row_group(rg)
    out = []
    for j in range(group.num_columns):
        column = group.column(j)
        if columns is not None and column.path_in_schema.split(".")[0] not in columns:
            continue
        start = column.data_page_offset
        if column.has_dictionary_page:
            start = min(start, column.dictionary_page_offset)
        out.append((start, column.total_compressed_size))
    return out


def test_parquet_reads_projected_columns_from_held_ranges_only(tmp_path: Path) -> None:
    data, md, table = write_parquet_file(tmp_path)
    columns = ["id", "name", "tokens"]  # a dictionary-encoded string and a list column
    for rg in range(md.num_row_groups):
        held = {o: data[o : o + n] for o, n in column_chunk_ranges(md, rg, set(columns))}
        assert sum(len(b) for b in held.values()) < len(data) / 3  # really a subset
        fetch = Recorder(data)
        source = RangeFile(len(data), held, fetch).arrow()
        handle = pq.ParquetFile(source, metadata=md, pre_buffer=False)
        got = handle.read_row_group(rg, columns=columns, use_threads=False)
        assert fetch.calls == []  # no fallback request: everything came from the held ranges
        assert got.equals(table.select(columns).slice(rg * 1000, 1000))


def test_parquet_reads_everything_through_fallback_fetches(tmp_path: Path) -> None:
    data, md, table = write_parquet_file(tmp_path)
    fetch = Recorder(data)
    handle = pq.ParquetFile(RangeFile(len(data), {}, fetch).arrow(), metadata=md, pre_buffer=False)
    assert handle.read(use_threads=False).equals(table)
    assert fetch.calls  # correct, only slower
    assert all(o >= 0 and o + n <= len(data) for o, n in fetch.calls)


def test_fetch_failure_reaches_the_parquet_reader_unchanged(tmp_path: Path) -> None:
    data, md, _ = write_parquet_file(tmp_path)
    error = OSError(
        "When reading from key 't.parquet' in bucket 'b': AWS Error SLOW_DOWN during GetObject "
        "operation: Please reduce your request rate."
    )

    def failing(offset: int, size: int) -> bytes:
        raise error

    handle = pq.ParquetFile(
        RangeFile(len(data), {}, failing).arrow(), metadata=md, pre_buffer=False
    )
    with pytest.raises(OSError) as info:
        handle.read_row_group(0, use_threads=False)
    assert info.value is error  # pyarrow re-raises the Python exception as is


# --- RangeFetcher ------------------------------------------------------------------------------


@pytest.fixture
def blob(tmp_path: Path) -> Iterator[tuple[str, bytes]]:
    """A local file of 3 MB of pseudo-random bytes."""
    data = np.random.default_rng(0).integers(0, 256, 3_000_000, dtype=np.uint8).tobytes()
    path = tmp_path / "blob.bin"
    path.write_bytes(data)
    yield str(path), data


class Reader:
    """``read(path, offset, size)`` with ``os.pread`` on a real file; records each request and
    the thread that made it."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, int, int, str]] = []
        self.lock = threading.Lock()

    def __call__(self, path: str, offset: int, size: int) -> bytes:
        with self.lock:
            self.calls.append((path, offset, size, threading.current_thread().name))
        fd = os.open(path, os.O_RDONLY)
        try:
            return os.pread(fd, size, offset)
        finally:
            os.close(fd)


def test_fetch_splits_parts_and_reassembles_exactly(
    blob: tuple[str, bytes], monkeypatch: pytest.MonkeyPatch
) -> None:
    path, data = blob
    monkeypatch.setattr(ranges, "PART_BYTES", 1000)
    read = Reader()
    fetcher = RangeFetcher(read)
    try:
        wanted = [(0, 3500), (10, 20), (2_900_000, 500), (2_000_000, 0)]
        got = fetcher.fetch(path, wanted).result(timeout=10)
    finally:
        fetcher.close()
    # Coalesced: the contained (10, 20) joins (0, 3500); the empty range is dropped.
    assert set(got) == {0, 2_900_000}
    assert bytes(got[0]) == data[:3500]
    assert bytes(got[2_900_000]) == data[2_900_000:2_900_500]
    assert sorted((o, n) for _, o, n, _ in read.calls) == [
        (0, 1000),
        (1000, 1000),
        (2000, 1000),
        (3000, 500),
        (2_900_000, 500),
    ]
    assert {p for p, _, _, _ in read.calls} == {path}
    assert all(name.startswith("tdu-fetch") for _, _, _, name in read.calls)


def test_fetch_default_part_size_and_single_part_not_copied(blob: tuple[str, bytes]) -> None:
    path, data = blob
    assert ranges.PART_BYTES == 8 << 20
    read = Reader()
    fetcher = RangeFetcher(read)
    try:
        got = fetcher.fetch(path, [(5, 2_000_000)]).result(timeout=10)
    finally:
        fetcher.close()
    assert [(o, n) for _, o, n, _ in read.calls] == [(5, 2_000_000)]
    assert type(got[5]) is bytes and got[5] == data[5:2_000_005]


def test_parts_are_fetched_concurrently(
    blob: tuple[str, bytes], monkeypatch: pytest.MonkeyPatch
) -> None:
    path, data = blob
    monkeypatch.setattr(ranges, "PART_BYTES", 100)
    barrier = threading.Barrier(4, timeout=5)  # passes only if 4 requests are in flight at once
    read = Reader()

    def together(p: str, offset: int, size: int) -> bytes:
        barrier.wait()
        return read(p, offset, size)

    fetcher = RangeFetcher(together)
    try:
        got = fetcher.fetch(path, [(1000, 400)]).result(timeout=10)
    finally:
        fetcher.close()
    assert bytes(got[1000]) == data[1000:1400]
    assert len({name for _, _, _, name in read.calls}) == 4


def test_empty_fetch_is_done_at_once() -> None:
    fetcher = RangeFetcher(Reader())
    future = fetcher.fetch("unused", [(0, 0)])
    assert future.done() and future.result() == {}
    fetcher.close()


def test_failing_part_surfaces_from_the_future(
    blob: tuple[str, bytes], monkeypatch: pytest.MonkeyPatch
) -> None:
    path, _ = blob
    monkeypatch.setattr(ranges, "PART_BYTES", 1000)
    error = OSError(
        "When reading from key 'blob.bin' in bucket 'b': AWS Error ACCESS_DENIED during "
        "GetObject operation: Access Denied"
    )
    read = Reader()

    def failing_at_2000(p: str, offset: int, size: int) -> bytes:
        data = read(p, offset, size)
        if offset == 2000:
            raise error
        return data

    fetcher = RangeFetcher(failing_at_2000)
    try:
        future = fetcher.fetch(path, [(0, 5000)])
        assert future.exception(timeout=10) is error
        with pytest.raises(OSError) as info:
            future.result()
        assert info.value is error
        assert len(read.calls) == 5  # the other parts were still requested
        # The fetcher stays usable after a failure.
        assert bytes(fetcher.fetch(path, [(0, 10)]).result(timeout=10)[0]) == blob[1][:10]
    finally:
        fetcher.close()


def test_close_is_safe_and_cancels_pending_parts(
    blob: tuple[str, bytes], monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    path, data = blob
    fetcher = RangeFetcher(Reader())
    fetcher.close()  # never used
    fetcher.close()  # twice

    monkeypatch.setattr(ranges, "PART_BYTES", 10)
    release = threading.Event()
    started = threading.Semaphore(0)
    read = Reader()

    def blocking(p: str, offset: int, size: int) -> bytes:
        started.release()
        release.wait(5)
        return read(p, offset, size)

    fetcher = RangeFetcher(blocking)
    future = fetcher.fetch(path, [(0, 10 * 50)])  # 50 parts, 8 threads
    for _ in range(threads.FETCH_THREADS):
        assert started.acquire(timeout=5)
    fetcher.close()  # pending parts cancelled; running ones finish
    release.set()
    with pytest.raises(CancelledError):
        future.result(timeout=10)
    assert len(read.calls) == threads.FETCH_THREADS  # the cancelled parts were never requested
    # A closed fetcher builds a new pool on the next fetch.
    got = fetcher.fetch(path, [(0, 25)]).result(timeout=10)
    assert bytes(got[0]) == data[:25]
    fetcher.close()
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]


def test_cancelling_the_result_leaves_no_error_behind(
    blob: tuple[str, bytes], monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    path, _ = blob
    monkeypatch.setattr(ranges, "PART_BYTES", 100)
    release = threading.Event()
    read = Reader()

    def blocking(p: str, offset: int, size: int) -> bytes:
        release.wait(5)
        return read(p, offset, size)

    fetcher = RangeFetcher(blocking)
    try:
        future = fetcher.fetch(path, [(0, 300)])
        assert future.cancel()
        release.set()
        # Doubtful but documented: cancelling the result does not cancel its parts; their
        # requests still go out, and their bytes are dropped.
        fetcher._pool.get().shutdown(wait=True)
        assert len(read.calls) == 3
        assert future.cancelled()
    finally:
        fetcher.close()
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]


# --- ReadsAhead --------------------------------------------------------------------------------


def test_reads_ahead_are_bounded_and_handed_over(blob: tuple[str, bytes]) -> None:
    path, data = blob
    read = Reader()
    ahead: ReadsAhead[tuple[str, int], bytes] = ReadsAhead(2, name="tdu-test-ahead")
    try:
        assert ahead.submit((path, 0), read, path, 0, 10)
        assert ahead.submit((path, 0), read, path, 0, 10)  # pending already: not read twice
        assert ahead.submit((path, 10), read, path, 10, 10)
        assert not ahead.submit((path, 20), read, path, 20, 10)  # two pending: not started
        assert len(ahead) == 2 and (path, 0) in ahead and set(ahead) == {(path, 0), (path, 10)}
        first = ahead.take((path, 0))
        assert first is not None and first.result(timeout=10) == data[:10]
        assert ahead.take((path, 0)) is None  # handed over, no longer pending
        ahead.drop((path, 10))
        assert not ahead
        assert ahead.start((path, 30), lambda: None) is False  # not worth reading ahead
        assert not ahead
    finally:
        ahead.close()
        ahead.close()
    assert sorted(c[1] for c in read.calls) in ([0], [0, 10])  # (the dropped one may have run)
    assert {c[3].rsplit("_", 1)[0] for c in read.calls} == {"tdu-test-ahead"}
    # Pickles through its arguments: no pending read, no thread.
    clone = pickle.loads(pickle.dumps(ahead))
    assert (clone.limit, clone.name, len(clone)) == (2, "tdu-test-ahead", 0)


def _child_reads_ahead(
    ahead: ReadsAhead[tuple[str, int], bytes], path: str, data: bytes, queue: Any
) -> None:
    mine = (len(ahead), ahead.take((path, 0)) is None)  # the parent's read is not here
    assert ahead.submit((path, 0), Reader(), path, 0, 100)  # on the child's own threads
    future = ahead.take((path, 0))
    assert future is not None
    queue.put((*mine, future.result(timeout=10) == data[:100]))
    ahead.close()


def test_a_forked_child_starts_its_own_reads_ahead(blob: tuple[str, bytes]) -> None:
    path, data = blob
    release = threading.Event()
    read = Reader()

    def blocked(p: str, offset: int, size: int) -> bytes:
        release.wait(30)
        return read(p, offset, size)

    ahead: ReadsAhead[tuple[str, int], bytes] = ReadsAhead(2)
    assert ahead.submit((path, 0), blocked, path, 0, 100)  # in flight in this process
    context = multiprocessing.get_context("fork")
    queue = context.Queue()
    child = context.Process(target=_child_reads_ahead, args=(ahead, path, data, queue))
    child.start()
    try:
        # The child saw none of the parent's reads, read on threads of its own, and did not
        # wait on the parent's read, which is still blocked.
        assert queue.get(timeout=30) == (0, True, True)
    finally:
        release.set()
        child.join(30)
    assert child.exitcode == 0
    mine = ahead.take((path, 0))
    assert mine is not None and mine.result(timeout=10) == data[:100]
    ahead.close()
