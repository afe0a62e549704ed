"""Reading a stream: the format's record batches plus partition columns, filtered and checked.

With a row filter, a piece's rows are counted after the filter (the plan counted each chunk's
rows that pass it), so a piece is read as its whole chunk, filtered, then sliced. Only a
stream's ends and resumed blocks cut inside a chunk, so little is read twice.

From object storage, small pieces are read ahead of need, several at once (`_Ahead`): a piece of
a small file costs a few requests (the identity check, a footer, the bytes) whatever its rows,
and read one after another those waits add up (656 files of 100 rows on S3 at 20 ms a request:
73 s to the first batch). Threads only read ahead; the rows come out in the order of the pieces,
each piece's rows and errors as if it had been read in its turn.
"""

from __future__ import annotations

import contextlib
import functools
import pickle
import threading
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa

from ..arrow_values import take
from ..errors import CorruptFileError, DataError, TorchDataloaderUtilsError
from ..formats import Format, ReadOptions
from ..fs import FileSystemSpec
from ..fs.forks import ProcessLocal
from ..fs.identity import Identity, check_identity
from ..fs.threads import COUNT_THREADS, READ_THREADS
from ..planning import Chunk, Piece
from ..skipping import SKIPPABLE, FailureLog, OnError, ReadFailure, fill_rows

__all__ = ["Reader", "count_rows", "with_partition"]

# Reading ahead (`_Ahead`), from object storage (not local files): a piece is read ahead when it
# holds at most _AHEAD_PIECE_BYTES (by `Reader.estimate`: its rows decoded, or its chunk's bytes
# if more); the pieces read ahead and not yet taken, being read or read, hold at most
# _AHEAD_BYTES and are at most _AHEAD_PIECES. Larger pieces are read in their turn, as are local
# files: a local piece's read is CPU work, most of it under the GIL, and threads only take turns
# (measured, 1,311 files of 50 rows, the first block: 0.61 s in turn, 0.75 s with 2 threads,
# 1.2-1.4 s with 4 to 16). On SeaweedFS with 20 ms added per request (about 5 requests a file:
# the identity check, the footer, the bytes), 656 files of 100 rows: 48 s in turn, 5.0 s with
# 16 threads (4.2 s with 32).
_AHEAD_PIECES = 64
_AHEAD_BYTES = 16 << 20
_AHEAD_PIECE_BYTES = 2 << 20
# Chunks a reader keeps made (more than the pieces within reach of reading ahead).
_MADE_CHUNKS = 4 * _AHEAD_PIECES


def with_partition(
    batch: pa.RecordBatch, partition: tuple[tuple[str, Any], ...], options: ReadOptions
) -> pa.RecordBatch:
    """Append the file's hive partition values as constant columns."""
    for key, value in partition:
        assert options.partition_schema is not None  # set whenever files have partitions
        field = options.partition_schema.field(key)
        batch = batch.append_column(field, pa.repeat(pa.scalar(value, field.type), batch.num_rows))
    return batch


@dataclass(frozen=True)
class Reader:
    """Reads pieces of the plan's chunks as the dataset yields them.

    Attributes:
        chunks: the plan's chunks, which pieces index.
        fmt: the format.
        fs: the filesystem.
        options: the read options (columns read, row filter, partition schema).
        output_columns: the columns batches carry (``None``: all read).
        check: returns why a batch's rows cannot be converted to the output, or None
            (called here, where the file and rows are known, so the error can name them).
        files: the files' identities pinned by the plan: each file is checked (one metadata
            request) before this reader first reads it.
        on_error: ``"raise"``, or ``"skip"``: rows that cannot be read are replaced (see
            `skipping`) and each failure added to ``failures``.
        failures: where skipped reads are recorded.
        row_bytes: estimated decoded bytes per row (the plan's): what pieces read ahead hold
            is estimated with it (0: by their chunks' ``num_bytes`` only).
    """

    chunks: Sequence[Chunk]
    fmt: Format
    fs: FileSystemSpec
    options: ReadOptions
    output_columns: tuple[str, ...] | None = None
    check: Callable[[pa.RecordBatch], tuple[type[DataError], str] | None] | None = None
    files: Mapping[str, Identity] = field(default_factory=dict)
    on_error: OnError = "raise"
    failures: FailureLog | None = None
    row_bytes: float = 0.0
    _checked: set[str] = field(default_factory=set, init=False, repr=False, compare=False)
    _skip: dict[str, Any] = field(default_factory=dict, init=False, repr=False, compare=False)
    _recent: deque[str] = field(
        default_factory=lambda: deque(maxlen=3), init=False, repr=False, compare=False
    )
    _made: dict[int, Chunk] = field(default_factory=dict, init=False, repr=False, compare=False)

    def _chunk(self, index: int) -> Chunk:
        """Chunk ``index``, made once while its pieces are within reach (a piece's read asks
        for its chunk about six times; `Chunks` makes a new object each time, ~8 µs)."""
        chunk = self._made.get(index)
        if chunk is None:
            if len(self._made) >= _MADE_CHUNKS:
                self._made.clear()
            chunk = self._made[index] = self.chunks[index]
        return chunk

    def read(
        self, parts: Iterable[tuple[list[Piece], np.ndarray | None]]
    ) -> Iterator[pa.RecordBatch]:
        """The rows of ``parts`` in order: each part is pieces, and which of their rows to take
        (``None``: all).

        Under ``on_error="skip"`` as many rows come out as the pieces hold: rows that cannot be
        read are replaced by copies of rows read before them (see `skipping`).

        Raises:
            NullValueError: a column holds nulls the output refuses, naming file and rows.
            DataError: a batch cannot be converted (strings not UTF-8, ...), naming the same.
            CorruptFileError: reading raised an error that is not one of the library's: this
                is the one place such errors get the file and rows named.
        """
        ahead = _Ahead(
            parts,
            self.fmt,
            read=self._piece,
            path=lambda piece: self._chunk(piece.chunk).path,
            estimate=self.estimate,
            threads=0 if self.fs.is_local else READ_THREADS,
            hints=not self.fs.is_local,  # (a local file has nothing to fetch ahead)
        )
        try:
            while (part := ahead.next_part()) is not None:
                pieces, select = part
                batches = (b for piece in pieces for b in self._guarded(piece, ahead.rows(piece)))
                if select is None:
                    yield from batches
                    continue
                self._settle()  # rows owed from before cannot be put among the ones taken
                rows = list(batches)
                self._settle()  # the rows to take from must all be there
                if rows:
                    yield take(pa.concat_batches(rows), select)
            self._settle()
        finally:
            ahead.close()
            self.fmt.close()

    def _guarded(self, piece: Piece, read: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        """The piece's rows (``read``: its read, in its turn or ahead); under
        ``on_error="skip"``, rows it could not read replaced as soon as a row read before (or,
        at the stream's start, after) them can stand in."""
        path = self._chunk(piece.chunk).path
        if not self._recent or self._recent[-1] != path:
            self._recent.append(path)
        if self.on_error == "raise":
            yield from read
            return
        got = 0
        try:
            for batch in read:
                got += batch.num_rows
                self._skip["donor"] = batch
                yield batch
                yield from self._owed()
        except SKIPPABLE as exc:
            chunk = self._chunk(piece.chunk)
            missing = piece.stop - piece.start - got
            self._skip["owed"] = self._skip.get("owed", 0) + missing
            self._skip["error"] = exc
            if self.failures is not None:
                self.failures.add(
                    ReadFailure(
                        file=self.fs.url(chunk.path),
                        rows=f"chunk {chunk.start}:{chunk.stop}, rows "
                        f"{piece.start + got}:{piece.stop}",
                        skipped=missing,
                        error=type(exc).__name__,
                        message=str(exc),
                    )
                )
            yield from self._owed()

    def _owed(self) -> Iterator[pa.RecordBatch]:
        owed, donor = self._skip.get("owed", 0), self._skip.get("donor")
        if owed and donor is not None:
            self._skip["owed"] = 0
            yield fill_rows(donor, owed)

    def _settle(self) -> None:
        """Raise when skipped rows could not be replaced: no row of the stream was readable
        before them (nor, within the part, after them)."""
        if self._skip.get("owed"):
            error = self._skip["error"]
            raise type(error)(
                f"{error} (on_error='skip' could not replace the {self._skip['owed']} rows "
                "skipped: no row before them in this stream was readable)"
            ) from error

    def recent_files(self) -> list[str]:
        """The URLs of the last files read (most recent last): what a batch being assembled
        now came from."""
        return [self.fs.url(path) for path in self._recent]

    def estimate(self, piece: Piece) -> float:
        """Bytes a read of ``piece`` holds, estimated: its rows decoded (a filtered read: its
        chunk's), or its chunk's bytes to read if more (a format fetches whole units)."""
        chunk = self._chunk(piece.chunk)
        rows = chunk.num_rows if self.options.filter is not None else piece.stop - piece.start
        return max(rows * self.row_bytes, float(chunk.num_bytes))

    def _hint(self, piece: Piece, fmt: Format) -> None:
        """Let ``fmt`` start fetching ``piece``, which it reads next. A hint never fails: what
        went wrong is raised by the piece's own read, at its turn (a file deleted after planning
        once failed the piece read before it, whose read hinted it)."""
        chunk = self._chunk(piece.chunk)
        start, stop = (
            (piece.start, piece.stop) if self.options.filter is None else (0, chunk.num_rows)
        )
        with contextlib.suppress(Exception):  # raised again by the piece's own read
            fmt.prefetch(chunk, start, stop, self.fs, self.options)

    def _piece(
        self, piece: Piece, fmt: Format, upcoming: Piece | None = None
    ) -> Iterator[pa.RecordBatch]:
        """The piece's rows read by ``fmt`` (the reader's format, or a thread's copy of it);
        ``upcoming``: the piece read next by ``fmt``, which may start downloading now."""
        try:
            yield from self._read_piece(piece, fmt, upcoming)
        except TorchDataloaderUtilsError:
            raise
        except (ValueError, IndexError, OverflowError, EOFError, pa.ArrowException) as exc:
            # A format let a parser's error through (a UnicodeDecodeError from names that are
            # not UTF-8, an Arrow error from bytes pyarrow rejects): name the file and rows.
            # (TypeError, KeyError and the like are bugs, not bad bytes: they pass as they are.)
            chunk = self._chunk(piece.chunk)
            raise CorruptFileError(
                f"{self.fs.url(chunk.path)} (chunk {chunk.start}:{chunk.stop}, rows "
                f"{piece.start}:{piece.stop}): cannot be read: {type(exc).__name__}: {exc}"
            ) from exc

    def _read_piece(
        self, piece: Piece, fmt: Format, upcoming: Piece | None = None
    ) -> Iterator[pa.RecordBatch]:
        if upcoming is not None:
            self._hint(piece, fmt)  # (already started, unless this is the first piece)
            self._hint(upcoming, fmt)
        chunk = self._chunk(piece.chunk)
        # (Pieces of one file read ahead at once may each check it: a request more, never
        # rows of a file not checked.)
        if chunk.path not in self._checked:
            pinned = self.files.get(chunk.path)
            if pinned is not None:
                check_identity(chunk.path, pinned, self.fs)
            self._checked.add(chunk.path)
        expr = self.options.filter
        if expr is None:
            position = piece.start
            for batch in fmt.read(chunk, piece.start, piece.stop, self.fs, self.options):
                yield self._finish(batch, chunk, position)
                position += batch.num_rows
            return
        # Piece rows count rows that pass the filter: read the chunk, filter, then slice.
        position = kept = 0
        for raw in fmt.read(chunk, 0, chunk.num_rows, self.fs, self.options):
            batch = with_partition(raw, chunk.partition, self.options).filter(expr)
            lo, hi = max(piece.start - kept, 0), min(piece.stop - kept, batch.num_rows)
            if lo < hi:
                yield self._finish(batch.slice(lo, hi - lo), chunk, position, partitioned=True)
            kept += batch.num_rows
            position += raw.num_rows
            if kept >= piece.stop:
                break

    def _finish(
        self, batch: pa.RecordBatch, chunk: Chunk, position: int, *, partitioned: bool = False
    ) -> pa.RecordBatch:
        if not partitioned:
            batch = with_partition(batch, chunk.partition, self.options)
        problem = self.check(batch) if self.check is not None else None
        if problem is not None:
            error, reason = problem
            raise error(
                f"{self.fs.url(chunk.path)} (chunk {chunk.start}:{chunk.stop}, rows from "
                f"{position}): {reason}"
            )
        if self.output_columns is not None:
            batch = batch.select(list(self.output_columns))
        return batch


# A piece read ahead: its batches, and the error that stopped its read (None: none).
_Read = tuple[list[pa.RecordBatch], BaseException | None]


class _Slot:
    """A piece of the stream, waiting to be read, and its read if started ahead."""

    __slots__ = ("future", "path", "piece", "size")

    def __init__(self, piece: Piece, path: str, size: float) -> None:
        self.piece = piece
        self.path = path
        self.size = size  # the bytes its read holds, estimated (`Reader.estimate`)
        self.future: Future[_Read] | None = None


def _replay(future: Future[_Read]) -> Iterator[pa.RecordBatch]:
    """A piece read ahead, as its reading in its turn would have gone: its batches, then the
    error that stopped it."""
    batches, error = future.result()
    yield from batches
    if error is not None:
        raise error


class _Ahead:
    """A stream's parts, their small pieces read ahead in threads; the consumer takes each
    piece's rows in order.

    Parts are taken from the stream as the consumer needs them and to see up to
    `_AHEAD_PIECES` pieces past the one it reads (no further: a part may hold all the pieces of
    a stream). The small pieces among those are read ahead while the pieces read ahead and not
    yet taken hold at most `_AHEAD_BYTES` (by the estimate). The consumer takes a piece read
    ahead as that read went (its batches, then its error, raised at the piece); a piece not
    read ahead is read then, with the reader's own format, and the next piece is hinted
    (`Format.prefetch`) when no thread will read it.

    Pieces are read in lanes, one per file: a thread takes a file's pieces in stream order
    with a copy of the format of its own (a format keeps an open file, which threads cannot
    share), so a file's footer, index or open handle serves all its pieces within reach, as
    for a read in turn (one copy per piece read the footer of a file of 3 row groups 3 times),
    and the next piece of the lane is hinted to that copy. Files are read in parallel.

    ``threads``: how many (0: none, every piece is read in its turn, as for local files). They
    are this process's (`fs.forks.ProcessLocal`), started by the first piece read ahead, and
    stopped (reads in progress awaited) by `close`. ``hints``: whether a piece read in its turn
    hints the next (False for local files, which have nothing to fetch ahead).
    """

    def __init__(
        self,
        parts: Iterable[tuple[list[Piece], np.ndarray | None]],
        fmt: Format,
        *,
        read: Callable[[Piece, Format, Piece | None], Iterator[pa.RecordBatch]],
        path: Callable[[Piece], str],
        estimate: Callable[[Piece], float],
        threads: int,
        hints: bool = True,
    ) -> None:
        self._source = iter(parts)
        self._threads = threads
        self._hints = hints
        self._fmt = fmt
        self._read_with = read
        self._path = path
        self._estimate = estimate
        self._parts: deque[tuple[list[Piece], np.ndarray | None]] = deque()  # for the consumer
        self._unseen: deque[list[Piece]] = deque()  # parts with pieces that have no slot yet
        self._next = 0  # the first piece of ``_unseen[0]`` that has no slot
        self._slots: deque[_Slot] = deque()  # the pieces within reach not yet taken, in order
        self._seen = 0  # how many of those (from the first) were considered for reading ahead
        self._held = 0.0  # estimated bytes of the pieces read ahead and not yet taken
        self._blob: bytes | None = None  # the pickled format, copied for each lane
        # (This process's: a lock a parent's thread held at a fork stays held in the child.)
        self._lock: ProcessLocal[threading.Lock] = ProcessLocal(threading.Lock)
        self._lanes: dict[str, deque[_Slot]] = {}  # by file: its pieces no thread took yet
        self._idle: list[Format] = []  # copies no thread is using
        self._copies: list[Format] = []
        self._closed = False
        self._pool: ProcessLocal[ThreadPoolExecutor] = ProcessLocal(
            functools.partial(ThreadPoolExecutor, threads, thread_name_prefix="tdu-read")
        )

    def next_part(self) -> tuple[list[Piece], np.ndarray | None] | None:
        """The next part (its pieces, each to be taken with `rows`, and which of their rows it
        takes), or None at the stream's end."""
        if not self._parts and not self._pull():
            return None
        self._schedule()
        return self._parts.popleft()

    def rows(self, piece: Piece) -> Iterator[pa.RecordBatch]:
        """The rows of ``piece``, the stream's next piece: as read ahead, or read now."""
        if not self._slots:
            self._reach()
        slot = self._slots.popleft()
        assert slot.piece is piece, "pieces are taken in order"
        self._seen = max(self._seen - 1, 0)
        if slot.future is not None:
            self._held -= slot.size
        self._schedule()
        if slot.future is not None:
            return _replay(slot.future)
        # The next piece starts downloading while this one is read, unless a thread will read
        # it (a format's fetch started here is taken only by the format's own reads).
        if not self._hints:
            return self._read_with(piece, self._fmt, None)
        following = self._slots[0] if self._slots or self._reach() else None
        upcoming = None if following is None or self._small(following) else following.piece
        return self._read_with(piece, self._fmt, upcoming)

    def _small(self, slot: _Slot) -> bool:
        """Whether ``slot`` is to be read ahead (when within reach and memory allows)."""
        return self._threads > 0 and slot.size <= _AHEAD_PIECE_BYTES

    def _pull(self) -> bool:
        """Take the stream's next part; False at its end."""
        part = next(self._source, None)
        if part is None:
            return False
        self._parts.append(part)
        self._unseen.append(part[0])
        return True

    def _reach(self) -> bool:
        """Bring the next piece within reach (a slot); False at the stream's end."""
        while not self._unseen or self._next == len(self._unseen[0]):
            if self._unseen:
                self._unseen.popleft()
                self._next = 0
            elif not self._pull():
                return False
        piece = self._unseen[0][self._next]
        self._next += 1
        self._slots.append(_Slot(piece, self._path(piece), self._estimate(piece)))
        return True

    def _schedule(self) -> None:
        """Start reading the small pieces within reach, as far as memory allows."""
        while self._threads and self._seen < _AHEAD_PIECES:
            if self._seen == len(self._slots) and not self._reach():
                return
            slot = self._slots[self._seen]
            if self._small(slot):
                if self._held and self._held + slot.size > _AHEAD_BYTES:
                    return  # until the consumer takes one
                if self._blob is None:
                    try:
                        self._blob = pickle.dumps(self._fmt)
                    except Exception:  # a format that does not pickle: every piece in turn
                        self._threads = 0
                        return
                slot.future = Future()
                self._held += slot.size
                with self._lock.get():
                    lane = self._lanes.get(slot.path)
                    if lane is None:
                        self._lanes[slot.path] = deque([slot])
                    else:
                        lane.append(slot)  # the thread reading the file takes it next
                if lane is None:
                    self._pool.get().submit(self._lane, slot.path)
            self._seen += 1

    def _lane(self, path: str) -> None:
        """In a thread: the pieces of ``path`` within reach, in order, with one copy of the
        format, until none is left."""
        fmt = self._format()
        try:
            while True:
                with self._lock.get():
                    lane = self._lanes[path]
                    if not lane or self._closed:
                        del self._lanes[path]
                        return
                    slot = lane.popleft()
                    upcoming = lane[0].piece if lane else None
                future = slot.future
                assert future is not None
                if future.set_running_or_notify_cancel():
                    future.set_result(self._read(slot.piece, fmt, upcoming))
        finally:
            with self._lock.get():
                self._idle.append(fmt)

    def _read(self, piece: Piece, fmt: Format, upcoming: Piece | None) -> _Read:
        """``piece`` read whole by ``fmt``; ``upcoming``: the piece ``fmt`` reads next."""
        batches: list[pa.RecordBatch] = []
        try:
            for batch in self._read_with(piece, fmt, upcoming):
                batches.append(batch)
        except BaseException as exc:  # raised where the consumer takes the piece
            return batches, exc
        return batches, None

    def _format(self) -> Format:
        with self._lock.get():
            if self._idle:
                return self._idle.pop()
        assert self._blob is not None
        fmt: Format = pickle.loads(self._blob)
        with self._lock.get():
            self._copies.append(fmt)
        return fmt

    def close(self) -> None:
        """Stop reading ahead: reads not started are dropped, reads in progress awaited (a
        process forked while a thread is inside a storage client's request inherits its locks
        held; a copy of the format is closed only when no thread uses it), copies closed."""
        with self._lock.get():
            self._closed = True
        for slot in self._slots:
            if slot.future is not None:
                slot.future.cancel()
        self._slots.clear()
        self._parts.clear()
        self._unseen.clear()
        pool = self._pool.pop()
        if pool is not None:
            pool.shutdown(wait=True, cancel_futures=True)
        with self._lock.get():
            copies, self._copies, self._idle = self._copies, [], []
        for fmt in copies:
            fmt.close()


def count_rows(
    chunks: Sequence[Chunk], fmt: Format, fs: FileSystemSpec, options: ReadOptions
) -> list[int]:
    """Rows of each chunk that pass ``options.filter``, reading only the columns it needs.

    Counting at plan time is what lets a filtered read keep equal batch counts on every rank
    and resume at a batch (see docs/concepts/model.md). ``options.columns`` should hold just
    the filter's columns.
    """
    expr = options.filter
    local = threading.local()
    blob = pickle.dumps(fmt)  # each thread its own copy: formats cache one open file
    copies: list[Format] = []

    def count(chunk: Chunk) -> int:
        own = getattr(local, "fmt", None)
        if own is None:
            own = local.fmt = pickle.loads(blob)
            copies.append(own)  # list.append is atomic
        total = 0
        for batch in own.read(chunk, 0, chunk.num_rows, fs, options):
            total += with_partition(batch, chunk.partition, options).filter(expr).num_rows
        return total

    try:
        if len(chunks) <= 1:
            return [count(c) for c in chunks]
        with ThreadPoolExecutor(COUNT_THREADS) as pool:
            return list(pool.map(count, chunks))
    finally:
        for copy in copies:
            copy.close()
