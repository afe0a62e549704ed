"""Reading a stream's small pieces ahead, in threads, from object storage (`Ahead`).

A piece of a small file costs a few requests (the identity check, a footer, the bytes) whatever
its rows; read one after another those waits add up. `Reader.read` takes its pieces through an
`Ahead`: threads read the small pieces ahead, and the consumer takes every piece's rows (and
errors) in order, as if it had been read in its turn.
"""

from __future__ import annotations

import functools
import pickle
import threading
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor

import numpy as np
import pyarrow as pa

from ..formats import Format
from ..fs.forks import ProcessLocal
from ..planning import Piece

__all__ = ["AHEAD_BYTES", "AHEAD_PIECES", "AHEAD_PIECE_BYTES", "Ahead"]

# Reading ahead (`Ahead`), from object storage (not local files): a piece is read ahead when it
# holds at most AHEAD_PIECE_BYTES (by `Reader.estimate`: its rows decoded, or its chunk's bytes if
# more); the pieces read ahead and not yet taken, being read or read, hold at most AHEAD_BYTES and
# are at most AHEAD_PIECES. Larger pieces are read in their turn, as are local files: their reads
# are CPU work under the GIL, which threads only slow down
# (docs/adr/0020-measurements-behind-constants.md#reading-ahead).
AHEAD_PIECES = 64
AHEAD_BYTES = 16 << 20
AHEAD_PIECE_BYTES = 2 << 20


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


class Ahead:
    """A stream's runs, their small pieces read ahead in threads; the consumer takes each
    piece's rows in order.

    Runs are taken from the stream as the consumer needs them and to see up to
    `AHEAD_PIECES` pieces past the one it reads (no further: a run may hold all the pieces of
    a stream). The small pieces among those are read ahead while the pieces read ahead and not
    yet taken hold at most `AHEAD_BYTES` (by the estimate). The consumer takes a piece read
    ahead as that read went (its batches, then its error, raised at the piece); a piece not
    read ahead is read then, with the reader's own format, and the next piece is hinted
    (`Format.prefetch`) when no thread will read it.

    Pieces are read in lanes, one per file: a thread takes a file's pieces in stream order
    with a copy of the format of its own (a format keeps an open file, which threads cannot
    share), so a file's footer, index or open handle serves all its pieces within reach, as
    for a read in turn (one copy per piece read the footer of a file of 3 row groups 3 times),
    and the next piece of the lane is hinted to that copy. Files are read in parallel.

    ``threads``: how many (0: none, every piece is read in its turn). They are this process's
    (`fs.forks.ProcessLocal`), started by the first piece read ahead, and stopped (reads in
    progress awaited) by `close`. Local files are read in their turn without an `Ahead`
    (`Reader.read`).
    """

    def __init__(
        self,
        runs: Iterable[tuple[list[Piece], np.ndarray | None]],
        fmt: Format,
        *,
        read: Callable[[Piece, Format, Piece | None], Iterator[pa.RecordBatch]],
        path: Callable[[Piece], str],
        estimate: Callable[[Piece], float],
        threads: int,
    ) -> None:
        self._incoming = iter(runs)
        self._threads = threads
        self._fmt = fmt
        self._read_with = read
        self._path = path
        self._estimate = estimate
        self._runs: deque[tuple[list[Piece], np.ndarray | None]] = deque()  # for the consumer
        self._unseen: deque[list[Piece]] = deque()  # runs with pieces that have no slot yet
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

    def next_run(self) -> tuple[list[Piece], np.ndarray | None] | None:
        """The next run (its pieces, each to be taken with `rows`, and which of their rows it
        takes), or None at the stream's end."""
        if not self._runs and not self._pull():
            return None
        self._schedule()
        return self._runs.popleft()

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
        following = self._slots[0] if self._slots or self._reach() else None
        upcoming = None if following is None or self._small(following) else following.piece
        return self._read_with(piece, self._fmt, upcoming)

    def _small(self, slot: _Slot) -> bool:
        """Whether ``slot`` is to be read ahead (when within reach and memory allows)."""
        return self._threads > 0 and slot.size <= AHEAD_PIECE_BYTES

    def _pull(self) -> bool:
        """Take the stream's next run; False at its end."""
        run = next(self._incoming, None)
        if run is None:
            return False
        self._runs.append(run)
        self._unseen.append(run[0])
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
        while self._threads and self._seen < AHEAD_PIECES:
            if self._seen == len(self._slots) and not self._reach():
                return
            slot = self._slots[self._seen]
            if self._small(slot):
                if self._held and self._held + slot.size > AHEAD_BYTES:
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
        self._runs.clear()
        self._unseen.clear()
        pool = self._pool.pop()
        if pool is not None:
            pool.shutdown(wait=True, cancel_futures=True)
        with self._lock.get():
            copies, self._copies, self._idle = self._copies, [], []
        for fmt in copies:
            fmt.close()
