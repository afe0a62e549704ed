"""`formats.opening.open_to_read_at`: a local file read at offsets (`LocalFile`, planning's
footer reads) as pyarrow's file reads it, and storage failures named as `open_input` names
them; `each_file`: planning's reads in threads, each taking the next file, in order."""

from __future__ import annotations

import random
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from torch_dataloader_utils.errors import StorageNotFoundError
from torch_dataloader_utils.formats.opening import (
    LocalFile,
    each_file,
    open_input,
    open_to_read_at,
)
from torch_dataloader_utils.fs import FileSystemSpec


def test_a_local_file_reads_at_offsets_as_pyarrow_reads_it(tmp_path: Path) -> None:
    path = tmp_path / "f.bin"
    path.write_bytes(bytes(range(256)) * 40)
    fs = FileSystemSpec("file")
    with open_to_read_at(str(path), fs) as local, open_input(str(path), fs) as arrow:
        assert isinstance(local, LocalFile)
        assert local.size() == arrow.size() == 10_240
        for nbytes, offset in [(8, 0), (100, 10_140), (64 << 10, 0), (50, 10_230), (10, 10_240)]:
            assert local.read_at(nbytes, offset) == arrow.read_at(nbytes, offset)


def test_a_missing_local_file_is_not_found_naming_it(tmp_path: Path) -> None:
    missing = tmp_path / "gone.parquet"
    with pytest.raises(StorageNotFoundError, match=r"gone\.parquet"):
        open_to_read_at(str(missing), FileSystemSpec("file"))


def test_each_file_reads_every_file_in_threads_and_keeps_their_order() -> None:
    rng = random.Random(3)
    pauses = [rng.random() * 0.004 for _ in range(200)]
    threads: set[int] = set()

    def read(i: int) -> int:
        threads.add(threading.get_ident())
        time.sleep(pauses[i])  # reads end out of order
        return i * 10

    assert each_file(read, list(range(200)), threads=8) == [i * 10 for i in range(200)]
    assert len(threads) > 1
    assert each_file(read, []) == []


def test_each_file_keeps_the_threads_busy_to_the_end() -> None:
    """A slow file holds up its thread only: the others take the rest (fixed tasks of several
    files left a thread a queue of its own behind one)."""
    ends: dict[int, float] = {}

    def read(i: int) -> int:
        time.sleep(0.3 if i == 0 else 0.01)
        ends[i] = time.monotonic()
        return i

    start = time.monotonic()
    each_file(read, list(range(40)), threads=4)
    assert max(ends[i] for i in range(1, 40)) - start < ends[0] - start  # done before file 0


def test_each_file_raises_the_first_failure_in_order_and_takes_no_more() -> None:
    taken: list[int] = []
    lock = threading.Lock()

    def read(i: int) -> int:
        with lock:
            taken.append(i)
        if i == 7:
            raise ValueError("seven")  # fails first, in time
        if i == 3:
            time.sleep(0.2)
            raise ValueError("three")  # ... but comes first in order
        time.sleep(0.02)
        return i

    with pytest.raises(ValueError, match="three"):
        each_file(read, list(range(500)), threads=4)
    assert 7 in taken and len(taken) < 50  # no file taken once one failed (a few in flight)


def test_an_interrupted_each_file_takes_no_more_files() -> None:
    """Ctrl-C while planning: the reads under way end and no other file is read (run in a
    process of its own: a SIGINT that came late would stop the test session)."""
    script = """
import os, signal, threading, time
from torch_dataloader_utils.formats.opening import each_file
read = []
def slow(i):
    read.append(i)
    time.sleep(0.02)
    return i
main = threading.main_thread().ident
threading.Timer(0.1, lambda: signal.pthread_kill(main, signal.SIGINT)).start()
start = time.monotonic()
try:
    each_file(slow, list(range(1000)), threads=4)
    print("done", len(read))
except KeyboardInterrupt:
    print("interrupted", len(read), round(time.monotonic() - start, 2))
"""
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=True
    ).stdout.split()
    assert out[0] == "interrupted"
    assert int(out[1]) < 200  # 1,000 files of 20 ms on 4 threads: 5 s had it read on
    assert float(out[2]) < 2.0
