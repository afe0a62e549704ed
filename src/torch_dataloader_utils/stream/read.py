"""Reading a stream: the format's record batches plus partition columns, filtered and checked.

With a row filter, a piece's rows are counted after the filter (the plan counted each chunk's
rows that pass it), so a piece is read as its whole chunk, filtered, then sliced. Only a
stream's ends and resumed blocks cut inside a chunk, so little is read twice.
"""

from __future__ import annotations

import pickle
import threading
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa

from ..arrow_values import take
from ..errors import CorruptFileError, DataError, TorchDataloaderUtilsError
from ..formats import Format, ReadOptions
from ..fs import FileSystemSpec
from ..fs.identity import Identity, check_identity
from ..fs.threads import COUNT_THREADS
from ..planning import Chunk, Piece
from ..skipping import SKIPPABLE, FailureLog, OnError, ReadFailure, fill_rows

__all__ = ["Reader", "count_rows", "with_partition"]


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
    _checked: set[str] = field(default_factory=set, init=False, repr=False, compare=False)
    _skip: dict[str, Any] = field(default_factory=dict, init=False, repr=False, compare=False)
    _recent: deque[str] = field(
        default_factory=lambda: deque(maxlen=3), init=False, repr=False, compare=False
    )

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
        try:
            queue = iter(parts)
            following = next(queue, None)
            while following is not None:
                (pieces, select), following = following, next(queue, None)
                # Each piece's bytes start downloading while the piece before it decodes.
                upcoming = [*pieces[1:], *(following[0][:1] if following is not None else [])]
                batches = (
                    b
                    for i, piece in enumerate(pieces)
                    for b in self._guarded(piece, upcoming[i] if i < len(upcoming) else None)
                )
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
            self.fmt.close()

    def _guarded(self, piece: Piece, upcoming: Piece | None) -> Iterator[pa.RecordBatch]:
        """The piece's rows; under ``on_error="skip"``, rows it could not read replaced as
        soon as a row read before (or, at the stream's start, after) them can stand in."""
        if self.on_error == "raise":
            yield from self._piece(piece, upcoming)
            return
        got = 0
        try:
            for batch in self._piece(piece, upcoming):
                got += batch.num_rows
                self._skip["donor"] = batch
                yield batch
                yield from self._owed()
        except SKIPPABLE as exc:
            chunk = self.chunks[piece.chunk]
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

    def _hint(self, piece: Piece) -> None:
        chunk = self.chunks[piece.chunk]
        if self.options.filter is None:
            self.fmt.prefetch(chunk, piece.start, piece.stop, self.fs, self.options)
        else:
            self.fmt.prefetch(chunk, 0, chunk.num_rows, self.fs, self.options)

    def _piece(self, piece: Piece, upcoming: Piece | None = None) -> Iterator[pa.RecordBatch]:
        try:
            yield from self._read_piece(piece, upcoming)
        except TorchDataloaderUtilsError:
            raise
        except (ValueError, IndexError, OverflowError, EOFError, pa.ArrowException) as exc:
            # A format let a parser's error through (a UnicodeDecodeError from names that are
            # not UTF-8, an Arrow error from bytes pyarrow rejects): name the file and rows.
            # (TypeError, KeyError and the like are bugs, not bad bytes: they pass as they are.)
            chunk = self.chunks[piece.chunk]
            raise CorruptFileError(
                f"{self.fs.url(chunk.path)} (chunk {chunk.start}:{chunk.stop}, rows "
                f"{piece.start}:{piece.stop}): cannot be read: {type(exc).__name__}: {exc}"
            ) from exc

    def _read_piece(self, piece: Piece, upcoming: Piece | None = None) -> Iterator[pa.RecordBatch]:
        if upcoming is not None:
            self._hint(piece)  # (already started, unless this is the first piece)
            self._hint(upcoming)
        chunk = self.chunks[piece.chunk]
        if chunk.path not in self._checked:
            pinned = self.files.get(chunk.path)
            if pinned is not None:
                check_identity(chunk.path, pinned, self.fs)
            self._checked.add(chunk.path)
        if not self._recent or self._recent[-1] != chunk.path:
            self._recent.append(chunk.path)
        expr = self.options.filter
        if expr is None:
            position = piece.start
            for batch in self.fmt.read(chunk, piece.start, piece.stop, self.fs, self.options):
                yield self._finish(batch, chunk, position)
                position += batch.num_rows
            return
        # Piece rows count rows that pass the filter: read the chunk, filter, then slice.
        position = kept = 0
        for raw in self.fmt.read(chunk, 0, chunk.num_rows, self.fs, self.options):
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
