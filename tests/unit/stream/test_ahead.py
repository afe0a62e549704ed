"""Small pieces read ahead in threads (`stream.ahead.Ahead`), from storage that is not local
(fsspec's ``memory://`` here): the rows, their order and the errors are those of reading each
piece in its turn, whatever the threads' timing."""

from __future__ import annotations

import os
import random
import signal
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import fsspec
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

import torch_dataloader_utils as tdu
from torch_dataloader_utils.errors.on_error import FailureLog
from torch_dataloader_utils.formats.parquet import ParquetFormat
from torch_dataloader_utils.formats.parquet import format as parquet_module
from torch_dataloader_utils.planning import Piece
from torch_dataloader_utils.stream import ahead as ahead_module
from torch_dataloader_utils.stream import read as read_module
from torch_dataloader_utils.stream.read import Reader

FILES, ROWS = 120, 7  # many tiny files: ids 0..839, 7 per file


@pytest.fixture
def tiny() -> Iterator[str]:
    """``FILES`` files of ``ROWS`` rows on the memory filesystem; its URL."""
    root = f"/tdu-ahead-{uuid.uuid4().hex}"
    memory = fsspec.filesystem("memory")
    for i in range(FILES):
        ids = np.arange(i * ROWS, (i + 1) * ROWS)
        out = pa.BufferOutputStream()
        # Two row groups per file: a piece can start or stop inside a file.
        pq.write_table(pa.table({"id": ids, "x": ids * 0.5}), out, row_group_size=4)
        memory.pipe_file(f"{root}/f-{i:04d}.parquet", out.getvalue().to_pybytes())
    yield f"memory://{root}"
    memory.rm(root, recursive=True)


def delete(url: str, name: str) -> None:
    fsspec.filesystem("memory").rm(f"{url.removeprefix('memory://')}/{name}")


@pytest.fixture
def jitter(monkeypatch: pytest.MonkeyPatch) -> None:
    """Reads finish in a random order: each waits a random moment first."""
    real = ParquetFormat.read
    rng = random.Random(7)
    lock = threading.Lock()

    def read(self: ParquetFormat, *args: Any, **kwargs: Any) -> Iterator[pa.RecordBatch]:
        with lock:
            pause = rng.random() * 0.003
        time.sleep(pause)
        yield from real(self, *args, **kwargs)

    monkeypatch.setattr(ParquetFormat, "read", read)


def ahead_off(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(read_module, "READ_THREADS", 0)


def counted_reads(monkeypatch: pytest.MonkeyPatch) -> list[Piece]:
    """The pieces read ahead (by threads), as they start."""
    started: list[Piece] = []
    real = ahead_module.Ahead._read

    def spy(self: Any, piece: Piece, *args: Any) -> Any:
        started.append(piece)
        return real(self, piece, *args)

    monkeypatch.setattr(ahead_module.Ahead, "_read", spy)
    return started


def epoch_ids(root: str, **options: Any) -> list[list[int]]:
    """Each batch's ids, for two epochs, read in this process."""
    loader = tdu.create_dataloader(root, output_format="arrow", num_workers=0, **options)
    epochs = []
    for _ in range(2):
        epochs.append([i for batch in loader for i in batch.column("id").to_pylist()])
    return epochs


@pytest.mark.parametrize("shuffle", [False, True])
@pytest.mark.parametrize("batch_size", [5, 64])
@pytest.mark.usefixtures("jitter")
def test_rows_and_order_as_read_in_turn(
    tiny: str, monkeypatch: pytest.MonkeyPatch, shuffle: bool, batch_size: int
) -> None:
    options = {"batch_size": batch_size, "shuffle": shuffle, "shuffle_seed": 3}
    started = counted_reads(monkeypatch)
    ahead = epoch_ids(tiny, **options)
    assert started, "the small pieces were read ahead"
    with monkeypatch.context() as patch:
        ahead_off(patch)
        started.clear()
        in_turn = epoch_ids(tiny, **options)
        assert not started
    assert ahead == in_turn  # the same rows in the same order, epoch by epoch
    for ids in ahead:
        assert sorted(ids) == list(range(FILES * ROWS))  # each row once
    if shuffle:
        assert ahead[0] != ahead[1]


@pytest.mark.usefixtures("jitter")
def test_filtered_rows_as_read_in_turn(tiny: str, monkeypatch: pytest.MonkeyPatch) -> None:
    kept = (pc.field("id") >= 100) & (pc.field("id") < 700) & (pc.field("x") != 200.5)
    options = {"batch_size": 8, "shuffle": True, "filters": kept}
    ahead = epoch_ids(tiny, **options)
    with monkeypatch.context() as patch:
        ahead_off(patch)
        in_turn = epoch_ids(tiny, **options)
    assert ahead == in_turn
    assert sorted(ahead[0]) == [i for i in range(100, 700) if i != 401]


def reader_of(root: str, **kwargs: Any) -> tuple[Reader, list[tuple[list[Piece], None]]]:
    """A reader of the plan of ``root``, and parts of one piece per chunk in plan order (each
    row group a chunk: two per file)."""
    loader = tdu.create_dataloader(root, num_workers=0)
    dataset = loader.dataset
    plan = dataset.plan
    reader = Reader(
        plan.chunks, dataset.format, dataset.fs, dataset.read_options, files=plan.files, **kwargs
    )
    parts = [([Piece(i, 0, c.num_rows)], None) for i, c in enumerate(plan.chunks)]
    return reader, parts


def read_until_error(reader: Reader, parts: Any) -> tuple[list[int], BaseException | None]:
    ids: list[int] = []
    try:
        for batch in reader.read(parts):
            ids.extend(batch.column("id").to_pylist())
    except Exception as exc:
        return ids, exc
    return ids, None


@pytest.mark.usefixtures("jitter")
def test_a_file_deleted_after_planning_fails_at_its_piece(
    tiny: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    reader, parts = reader_of(tiny)
    delete(tiny, "f-0050.parquet")
    ids, error = read_until_error(reader, parts)
    assert isinstance(error, tdu.StorageNotFoundError)
    assert "f-0050.parquet" in str(error)
    assert ids == list(range(50 * ROWS))  # every row before the file's, none after
    with monkeypatch.context() as patch:
        ahead_off(patch)
        reader, parts = reader_of_plan(reader, parts)
        assert read_until_error(reader, parts)[0] == ids


def reader_of_plan(reader: Reader, parts: Any) -> tuple[Reader, Any]:
    """A fresh reader of the same plan (a reader keeps which files it checked)."""
    return (
        Reader(
            reader.chunks,
            reader.fmt,
            reader.fs,
            reader.options,
            files=reader.files,
            on_error=reader.on_error,
            failures=FailureLog() if reader.failures is not None else None,
        ),
        parts,
    )


@pytest.mark.usefixtures("jitter")
def test_skip_counts_a_deleted_file_at_its_piece(
    tiny: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    reader, parts = reader_of(tiny, on_error="skip", failures=FailureLog())
    delete(tiny, "f-0050.parquet")
    delete(tiny, "f-0051.parquet")
    ids, error = read_until_error(reader, parts)
    assert error is None
    assert len(ids) == FILES * ROWS  # the rows skipped are replaced
    assert ids[: 50 * ROWS] == list(range(50 * ROWS))
    assert ids[52 * ROWS :] == list(range(52 * ROWS, FILES * ROWS))
    assert reader.failures is not None
    failures = reader.failures.drain()
    assert [Path(f.file).name for f in failures] == ["f-0050.parquet"] * 2 + ["f-0051.parquet"] * 2
    assert all(f.error == "StorageNotFoundError" for f in failures)
    assert sum(f.skipped for f in failures) == 2 * ROWS
    with monkeypatch.context() as patch:
        ahead_off(patch)
        again, parts = reader_of_plan(reader, parts)
        assert read_until_error(again, parts) == (ids, None)
        assert again.failures is not None
        assert again.failures.drain() == failures


def test_reads_ahead_are_bounded(tiny: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ahead_module, "AHEAD_PIECES", 5)
    started = counted_reads(monkeypatch)
    reader, parts = reader_of(tiny)
    seen = 0
    for _batch in reader.read(parts):
        seen += 1
        time.sleep(0.001)  # a slow consumer: the threads would run far ahead
        # Pieces taken: at least ``seen`` batches' pieces were (a piece gives one batch here).
        assert len(started) <= seen + 5
    assert seen == len(parts)
    assert len(started) == len(parts)


def test_large_pieces_are_read_in_turn(tiny: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ahead_module, "AHEAD_PIECE_BYTES", 0)
    started = counted_reads(monkeypatch)
    reader, parts = reader_of(tiny)
    ids, error = read_until_error(reader, parts)
    assert error is None and ids == list(range(FILES * ROWS))
    assert not started


def test_threads_end_with_the_stream(tiny: str) -> None:
    before = set(threading.enumerate())

    def ours() -> list[threading.Thread]:
        return [
            t for t in threading.enumerate() if t.name.startswith("tdu-read") and t not in before
        ]

    reader, parts = reader_of(tiny)
    stream = reader.read(parts)
    next(stream)
    assert ours()
    stream.close()
    assert not ours()


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_a_forked_child_reads_with_threads_of_its_own(tiny: str) -> None:
    reader, parts = reader_of(tiny)
    stream = reader.read(parts)
    first = next(stream)  # the parent's threads are reading ahead
    pid = os.fork()
    if pid == 0:  # the child: drop what it inherited, then read the whole stream itself
        code = 1
        try:
            stream.close()  # must not wait on the parent's threads
            again, parts_again = reader_of_plan(reader, parts)
            ids = [i for b in again.read(parts_again) for i in b.column("id").to_pylist()]
            code = 0 if ids == list(range(FILES * ROWS)) else 2
        finally:
            os._exit(code)
    deadline = time.monotonic() + 60
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            break
        if time.monotonic() > deadline:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            pytest.fail("the forked child hung")
        time.sleep(0.05)
    assert os.waitstatus_to_exitcode(status) == 0
    rest = [i for b in stream for i in b.column("id").to_pylist()]
    assert first.column("id").to_pylist() + rest == list(range(FILES * ROWS))


def test_local_files_are_read_in_turn(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Local reads are CPU work under the GIL: threads would only take turns.
    for i in range(20):
        ids = np.arange(i * ROWS, (i + 1) * ROWS)
        pq.write_table(pa.table({"id": ids}), tmp_path / f"f-{i:04d}.parquet")
    started = counted_reads(monkeypatch)
    ids = epoch_ids(str(tmp_path), batch_size=4, shuffle=True)
    assert sorted(ids[0]) == list(range(20 * ROWS))
    assert not started


def test_a_file_is_opened_once_for_its_pieces(tiny: str, monkeypatch: pytest.MonkeyPatch) -> None:
    # A file's pieces go to one thread (its lane): its footer serves them all, as in turn.
    footers: list[str] = []
    real = parquet_module.read_footer

    def spy(source: Any, size: int, url: str, *args: Any, **kwargs: Any) -> Any:
        footers.append(url)
        return real(source, size, url, *args, **kwargs)

    monkeypatch.setattr(parquet_module, "read_footer", spy)
    reader, parts = reader_of(tiny)  # two pieces a file, one after the other
    assert sum(len(pieces) for pieces, _ in parts) == 2 * FILES
    footers.clear()
    ids, error = read_until_error(reader, parts)
    assert error is None and ids == list(range(FILES * ROWS))
    assert len(set(footers)) == FILES
    assert len(footers) < 1.5 * FILES  # (a piece per thread: 2 * FILES)


class _Unpicklable(ParquetFormat):
    def __reduce__(self) -> Any:
        raise TypeError("this format does not pickle")


def test_a_format_that_does_not_pickle_is_read_in_turn(
    tiny: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    started = counted_reads(monkeypatch)
    reader, parts = reader_of(tiny)
    reader = Reader(reader.chunks, _Unpicklable(), reader.fs, reader.options, files=reader.files)
    ids, error = read_until_error(reader, parts)
    assert error is None and ids == list(range(FILES * ROWS))
    assert not started
