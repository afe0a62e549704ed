"""Opening files and parsing them: storage failures and bad bytes told apart."""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from types import TracebackType
from typing import Any, TypeVar

import pyarrow as pa

from ..errors import CorruptFileError, StorageError
from ..fs import FileSystemSpec, translate_os_error
from ..fs.retry import is_missing, is_refused, is_transient
from ..fs.threads import PLAN_THREADS

__all__ = [
    "PLAN_THREADS",
    "LocalFile",
    "arrow_owned",
    "each_file",
    "open_input",
    "open_to_read_at",
    "parsing",
    "read_range",
    "slice_batches",
]


T = TypeVar("T")
U = TypeVar("U")


def each_file(
    read: Callable[[T], U], files: Sequence[T], *, threads: int = PLAN_THREADS
) -> list[U]:
    """``read`` of each of ``files`` (in order), run in up to ``threads`` planning threads
    (`fs.threads.PLAN_THREADS` by default), each taking the next file no thread has taken:
    no task a file to hand out, and no thread left with a queue of its own while the others
    are done (fixed tasks of 15 files each left 2,000 remote footers' last reads to a few
    threads: docs/benchmarks.md#planning-reads-each-footer-in-the-next-free-thread).

    After a file fails (or the caller is interrupted), no file is taken any more; once the
    files taken are read, the error of the first file (in order) that failed is raised: the
    one a read in order would meet.
    """
    total = len(files)
    out: list[Any] = [None] * total
    lock = threading.Lock()
    untaken = iter(range(total))
    failed: dict[int, BaseException] = {}
    halt = threading.Event()

    def work() -> None:
        while not halt.is_set():
            with lock:
                i = next(untaken, None)
            if i is None:
                return
            try:
                out[i] = read(files[i])
            except BaseException as exc:  # raised below, in the caller's thread
                with lock:
                    failed[i] = exc
                halt.set()

    count = max(1, min(threads, total))
    with ThreadPoolExecutor(count, thread_name_prefix="tdu-plan") as pool:
        try:
            for started in [pool.submit(work) for _ in range(count)]:
                started.result()
        except BaseException:  # (a KeyboardInterrupt): the reads under way end, no others
            halt.set()
            raise
    if failed:
        raise failed[min(failed)]
    return out


def open_input(path: str, fs: FileSystemSpec) -> pa.NativeFile:
    """Open ``path``; storage failures (missing, denied, unreachable) are raised here, so that
    any error while parsing afterwards means the bytes are bad (pyarrow raises some parse
    errors, like a footer that does not deserialize, as ``OSError``)."""
    try:
        return fs.open_input(path)
    except OSError as exc:
        raise translate_os_error(exc, fs.url(path)) from exc


class LocalFile:
    """A local file read at offsets with ``os.pread``: what a footer read asks of a
    `pyarrow.NativeFile` (``size``, ``read_at``), for planning, which opens every file once.
    Opening, sizing and reading a small file's tail this way took 5 µs against pyarrow's 7-10
    (docs/benchmarks.md#planning-20000-files). A context manager that closes the file."""

    __slots__ = ("_fd",)

    def __init__(self, fd: int) -> None:
        self._fd = fd

    def size(self) -> int:
        return os.fstat(self._fd).st_size

    def read_at(self, nbytes: int, offset: int) -> bytes:
        return os.pread(self._fd, nbytes, offset)

    def __enter__(self) -> LocalFile:
        return self

    def __exit__(self, *exc: object) -> None:
        os.close(self._fd)


def open_to_read_at(path: str, fs: FileSystemSpec) -> pa.NativeFile | LocalFile:
    """``path`` opened to read at offsets (`size`, `read_at`): on local storage a
    `LocalFile` where the system has ``os.pread``, elsewhere `open_input`. Storage failures
    are raised here, as `open_input` raises them."""
    if not (fs.is_local and _PREAD):
        return open_input(path, fs)
    try:
        return LocalFile(os.open(path, os.O_RDONLY | _CLOEXEC))
    except OSError as exc:
        raise translate_os_error(exc, fs.url(path)) from exc


_PREAD = hasattr(os, "pread")  # (not on Windows)
_CLOEXEC = getattr(os, "O_CLOEXEC", 0)


def parsing(where: str, kind: str = "a readable Parquet file") -> _Parsing:
    """Errors while parsing an opened file: bad bytes (`CorruptFileError`, saying the file is
    not ``kind``), unless the storage failed mid-read (a `StorageError`, which `fs.request`
    retries when it is transient). A context manager."""
    return _Parsing(where, kind)


class _Parsing:
    """`parsing`'s context manager: a class, cheaper than a generator's, for it is entered twice
    a file (docs/adr/0020-measurements-behind-constants.md#small-local-files)."""

    __slots__ = ("kind", "where")

    def __init__(self, where: str, kind: str) -> None:
        self.where = where
        self.kind = kind

    def __enter__(self) -> None:
        return None

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        where = self.where
        if exc is None or isinstance(exc, StorageError):
            return  # (a request failed after its retries, e.g. inside a range read: as it is)
        if isinstance(exc, UnicodeDecodeError):  # a corrupt footer's column names
            raise CorruptFileError(f"{where}: not {self.kind} ({exc})") from exc
        if isinstance(exc, OSError | pa.ArrowException):
            if isinstance(exc, OSError) and (
                is_transient(exc) or is_missing(exc) or is_refused(exc)
            ):
                raise translate_os_error(exc, where) from exc  # storage, never bad bytes
            if is_transient(exc):
                raise StorageError(f"{where}: {exc}") from exc
            raise CorruptFileError(f"{where}: not {self.kind} ({exc})") from exc


def arrow_owned(data: bytes) -> pa.Buffer:
    """``data`` copied into memory Arrow allocated, for pyarrow's CSV and JSON readers.

    Those readers read ahead on Arrow's IO threads, which may drop the last reference to the
    input after Python has begun to exit; a Python-owned buffer released there needs the GIL,
    and a thread that asks for it then is ended with ``pthread_exit``, which aborts the process
    (SIGABRT: "terminate called without an active exception"). The copy is cheap next to the
    parse (docs/adr/0020-measurements-behind-constants.md#text-reads).
    """
    buffer = pa.allocate_buffer(len(data))
    with pa.FixedSizeBufferWriter(buffer) as writer:
        writer.write(data)
    return buffer


def read_range(path: str, offset: int, size: int, fs: FileSystemSpec) -> bytes:
    """Bytes ``[offset, offset + size)`` of ``path`` (a retried range read).

    Raises:
        StorageError: the read failed (translated from the filesystem's ``OSError``).
    """
    try:
        return fs.read_range(path, offset, size)
    except OSError as exc:
        raise translate_os_error(exc, fs.url(path)) from exc


def slice_batches(
    batches: Iterator[pa.RecordBatch], start: int, stop: int, where: str
) -> Iterator[pa.RecordBatch]:
    """Rows ``[start, stop)`` of the concatenation of ``batches`` (zero-copy slices).

    Raises:
        CorruptFileError: the row group holds fewer rows than its footer says.
    """
    pos = 0
    for batch in batches:
        rows = batch.num_rows
        lo, hi = max(start, pos), min(stop, pos + rows)
        if lo < hi:
            yield batch if hi - lo == rows else batch.slice(lo - pos, hi - lo)
        pos += rows
        if pos >= stop:
            return
    raise CorruptFileError(f"{where}: decoded {pos} rows, fewer than the footer's count")
