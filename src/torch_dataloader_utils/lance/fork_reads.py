"""Reads of a forked worker: through a reader process of its own, never through pylance in it.

pylance is not fork-safe: once a process has used it (planning opens the dataset), a child
forked from it crashes or hangs when it calls pylance (SIGSEGV, SIGABRT and heap corruption
were seen reading a fragment in such a child, even with a dataset opened anew). A DataLoader
worker forked after pylance was imported (`forked_after_lance`) therefore reads through a
`ReaderProcess`: a fresh Python process running `reader_process`, started by the worker, that
sends the batches back pickled (`read_forked`; a process keeps its reader processes for its
lifetime, one per read in flight). Spawned and forkserver workers call pylance themselves.
"""

from __future__ import annotations

import os
import pickle
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa

from ..errors import CorruptFileError, StorageError, StorageNotFoundError
from ..fs import ProcessLocal
from . import reader_process

__all__ = ["ReaderProcess", "forked_after_lance", "read_forked"]

_forked_after_lance = False


def _after_fork_in_child() -> None:
    global _forked_after_lance
    if "lance" in sys.modules:  # (the parent may have used it: its threads are gone here)
        _forked_after_lance = True


os.register_at_fork(after_in_child=_after_fork_in_child)


def forked_after_lance() -> bool:
    """Whether this process was forked (at any depth) from one that had imported pylance."""
    return _forked_after_lance


def _error(kind: str, message: str, where: str) -> Exception:
    """The library's error for what the reader process raised."""
    if "not found" in message.lower():
        return StorageNotFoundError(f"{where}: {message}")
    return CorruptFileError(f"{where}: cannot be read: {kind}: {message}")


class ReaderProcess:
    """A reader process of this process's own, started on first use (and again if it died)."""

    def __init__(self) -> None:
        self._process: subprocess.Popen[bytes] | None = None

    def _started(self) -> subprocess.Popen[bytes]:
        process = self._process
        if process is None or process.poll() is not None:
            source = Path(reader_process.__file__).read_text(encoding="utf-8")
            found = getattr(sys.modules.get("lance"), "__file__", None)
            folder = [str(Path(found).parent.parent)] if found else []
            process = self._process = subprocess.Popen(
                [sys.executable, "-c", source, *folder],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
            )
        return process

    @staticmethod
    def _frame(process: subprocess.Popen[bytes], where: str) -> tuple[str, Any]:
        assert process.stdout is not None
        try:
            frame: tuple[str, Any] = pickle.load(process.stdout)
        except (EOFError, pickle.UnpicklingError):  # (the pipe ended, or ended mid-frame)
            try:
                code = process.wait(timeout=5)
            except subprocess.TimeoutExpired:  # (a frame garbled by a process still running)
                process.kill()
                code = process.wait()
            raise StorageError(
                f"{where}: this worker's Lance reader process exited (code {code}) before it "
                "answered; its error, if any, is on stderr"
            ) from None
        return frame

    def read(self, request: dict[str, Any], where: str) -> Iterator[pa.RecordBatch]:
        """The batches of ``request`` (see `reader_process`), read by the reader process.

        Raises:
            StorageNotFoundError: the dataset or its version is gone.
            CorruptFileError: the reader process could not read the fragment.
            StorageError: the reader process died.
        """
        process = self._started()
        assert process.stdin is not None
        pickle.dump(request, process.stdin, protocol=5)
        process.stdin.flush()
        finished = False
        try:
            while True:
                kind, value = self._frame(process, where)
                if kind == "batch":
                    yield value
                    continue
                finished = True
                if kind == "error":
                    raise _error(value[0], value[1], where)
                return
        finally:
            # A reader that stopped early leaves frames in the pipe: read them to the end, so
            # that the next request's answer starts with its own.
            while not finished:
                try:
                    finished = self._frame(process, where)[0] != "batch"
                except StorageError:
                    finished = True

    def close(self) -> None:
        """Stop the reader process (it exits when its stdin closes)."""
        process, self._process = self._process, None
        if process is None:
            return
        if process.stdin is not None:
            process.stdin.close()
        try:
            process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        if process.stdout is not None:
            process.stdout.close()


class _Readers:
    """This process's reader processes: one lent to each read in flight (a stream's read-ahead
    threads read at once), kept for later reads, the format's copies and epochs."""

    def __init__(self) -> None:
        self._idle: list[ReaderProcess] = []
        self._lock = threading.Lock()

    def read(self, request: dict[str, Any], where: str) -> Iterator[pa.RecordBatch]:
        with self._lock:
            reader = self._idle.pop() if self._idle else ReaderProcess()
        try:
            yield from reader.read(request, where)
        finally:
            with self._lock:
                self._idle.append(reader)


_readers: ProcessLocal[_Readers] = ProcessLocal(_Readers)


def read_forked(request: dict[str, Any], where: str) -> Iterator[pa.RecordBatch]:
    """The batches of ``request`` (see `reader_process`), read by one of this process's reader
    processes. Errors as `ReaderProcess.read`'s."""
    return _readers.get().read(request, where)
