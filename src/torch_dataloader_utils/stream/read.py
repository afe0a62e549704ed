"""Reading a stream: the format's record batches plus partition columns, filtered and checked.

With a row filter or a transform, a piece's rows are counted after them (the plan counted each
chunk's rows that pass the filter, and the census the rows the transform yields), so a piece is
read as its whole chunk, filtered and transformed, then sliced. Only a stream's ends and
resumed blocks cut inside a chunk, so little is read twice. A tokenized source's tokens are
made for the rows taken (`tokenizing.Derivation`).

From object storage, small pieces are read ahead of need, several at once (`stream.ahead`): a
piece of a small file costs a few requests (the identity check, a footer, the bytes) whatever its
rows, and read one after another those waits add up
(docs/adr/0020-measurements-behind-constants.md#reading-ahead). Threads only read ahead; the
rows come out in the order of the pieces, each piece's rows and errors as if it had been read in
its turn.
"""

from __future__ import annotations

import contextlib
import time
from collections import deque
from collections.abc import Callable, Generator, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np
import pyarrow as pa

from ..convert.arrow_values import take
from ..errors import CorruptFileError, DataError, NullValueError, TorchDataloaderUtilsError
from ..errors.on_error import SKIPPABLE, FailureLog, OnError, ReadFailure, fill_rows
from ..formats import Format, ReadOptions
from ..formats.partitions import with_partition
from ..fs import FileSystemSpec
from ..fs.identity import Identity, check_identity
from ..fs.threads import READ_THREADS
from ..planning import Chunk, Piece
from ..planning.plan import portable_schema
from ..tokenizing import Derivation
from .ahead import AHEAD_PIECES, Ahead

if TYPE_CHECKING:
    from ..convert import Problem

__all__ = ["Reader", "Reads"]

# Chunks a reader keeps made (more than the pieces within reach of reading ahead).
_MADE_CHUNKS = 4 * AHEAD_PIECES


class Reads(Protocol):
    """What the pipeline reads a stream's rows of one source with (`Reader`, or a packed
    dataset's `stream.tokens.TokenReader`)."""

    def read(
        self, runs: Iterable[tuple[list[Piece], Any]], first_rows: int = 0
    ) -> Iterator[pa.RecordBatch]:
        """The rows of ``runs`` in order (each run: its pieces, and which of their rows);
        ``first_rows``: how many of the first are wanted at once (`Format.quick_start`)."""

    def recent_files(self) -> list[str]:
        """The URLs of the last files read."""

    @property
    def local(self) -> bool:
        """Whether the files are on a local filesystem (a read waits on nothing but the
        disk)."""


class _InTurn:
    """`Ahead`'s stand-in for pieces read in their turn, nothing ahead (local files)."""

    def __init__(
        self,
        runs: Iterable[tuple[list[Piece], np.ndarray | None]],
        read: Callable[[Piece], Iterator[pa.RecordBatch]],
    ) -> None:
        self._runs = iter(runs)
        self.rows = read

    def next_run(self) -> tuple[list[Piece], np.ndarray | None] | None:
        return next(self._runs, None)

    def close(self) -> None:
        return None


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
        files: the files' identities pinned by the plan: each file is checked before this
            reader first reads it (one metadata request, shared with this reader's open of it:
            `fs.identity.check_identity`).
        on_error: ``"raise"``, or ``"skip"``: rows that cannot be read are replaced (see
            `skipping`) and each failure added to ``failures``.
        failures: where skipped reads are recorded.
        row_bytes: estimated decoded bytes per row (the plan's): what pieces read ahead hold
            is estimated with it (0: by their chunks' ``num_bytes`` only).
        schema: the plan's schema: a batch whose columns differ from it only as planning lets
            files differ (nullability; a child's name, `planning.plan.portable_schema`) is cast
            to it, so that the batches of different files concatenate (``None``: as read).
        derive: what is computed from the rows read (a transform, tokens), or ``None``.
        chunk_rows: with a transform, the rows the census counted in each chunk: a read that
            yields another count is a `DataError`.
    """

    chunks: Sequence[Chunk]
    fmt: Format
    fs: FileSystemSpec
    options: ReadOptions
    output_columns: tuple[str, ...] | None = None
    check: Callable[[pa.RecordBatch], Problem | None] | None = None
    files: Mapping[str, Identity] = field(default_factory=dict)
    on_error: OnError = "raise"
    failures: FailureLog | None = None
    row_bytes: float = 0.0
    schema: pa.Schema | None = None
    derive: Derivation | None = None
    chunk_rows: np.ndarray | None = None
    _checked: set[str] = field(default_factory=set, init=False, repr=False, compare=False)
    # When this reader began: a metadata request made since (its own open of a file) is fresh
    # enough for the file's check; one made before, for an earlier pass, is not.
    _began: float = field(default_factory=time.monotonic, init=False, repr=False, compare=False)
    _skip: dict[str, Any] = field(default_factory=dict, init=False, repr=False, compare=False)
    _recent: deque[str] = field(
        default_factory=lambda: deque(maxlen=3), init=False, repr=False, compare=False
    )
    _made: dict[int, Chunk] = field(default_factory=dict, init=False, repr=False, compare=False)
    # Each schema batches came in, and what it is cast to (None: kept as it is).
    _casts: list[tuple[pa.Schema, pa.Schema | None]] = field(
        default_factory=list, init=False, repr=False, compare=False
    )

    def _chunk(self, index: int) -> Chunk:
        """Chunk ``index``, made once while its pieces are within reach: a piece's read asks
        for its chunk about six times, and `Chunks` makes a new object each time
        (docs/adr/0020-measurements-behind-constants.md#small-local-files)."""
        chunk = self._made.get(index)
        if chunk is None:
            if len(self._made) >= _MADE_CHUNKS:
                self._made.clear()
            chunk = self._made[index] = self.chunks[index]
        return chunk

    def read(
        self, runs: Iterable[tuple[list[Piece], np.ndarray | None]], first_rows: int = 0
    ) -> Generator[pa.RecordBatch, None, None]:
        """The rows of ``runs`` in order: each run is its pieces, and which of their rows to
        take (``None``: all); ``first_rows``: how many of the first are wanted at once (the
        stream's first block: `Format.quick_start`).

        Under ``on_error="skip"`` as many rows come out as the pieces hold: rows that cannot be
        read are replaced by copies of rows read before them (see `skipping`).

        Raises:
            NullValueError: a column holds nulls the output refuses, naming file and rows.
            DataError: a batch cannot be converted (strings not UTF-8, ...), naming the same.
            CorruptFileError: reading raised an error that is not one of the library's: this
                is the one place such errors get the file and rows named.
        """
        # Local pieces are read in their turn, without an Ahead: a local file has nothing to fetch
        # ahead (docs/adr/0020-measurements-behind-constants.md#small-local-files).
        ahead: Ahead | _InTurn = (
            _InTurn(runs, lambda piece: self._piece(piece, self.fmt))
            if self.fs.is_local
            else Ahead(
                runs,
                self.fmt,
                read=self._piece,
                path=lambda piece: self._chunk(piece.chunk).path,
                estimate=self.estimate,
                threads=READ_THREADS,
            )
        )
        # (Not where chunks are read whole, filtered or transformed: decoded as the census
        # counted them, in the same batches.)
        if first_rows and not self._whole:
            self.fmt.quick_start(first_rows)
        try:
            while (run := ahead.next_run()) is not None:
                pieces, select = run
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
        ``on_error="skip"``, rows it could not read replaced (`_skipping`)."""
        path = self._chunk(piece.chunk).path
        if not self._recent or self._recent[-1] != path:
            self._recent.append(path)
        return read if self.on_error == "raise" else self._skipping(piece, read)

    def _skipping(self, piece: Piece, read: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        """``read``, rows it could not read replaced as soon as a row read before (or, at the
        stream's start, after) them can stand in."""
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
        before them (nor, within the run, after them)."""
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

    @property
    def local(self) -> bool:
        """Whether the files are on a local filesystem."""
        return self.fs.is_local

    @property
    def _whole(self) -> bool:
        """Whether a piece's rows are counted after a filter or a transform: its chunk is read
        whole."""
        return self.options.filter is not None or (
            self.derive is not None and self.derive.counts_rows
        )

    def estimate(self, piece: Piece) -> float:
        """Bytes a read of ``piece`` holds, estimated: its rows decoded (a filtered read: its
        chunk's), or its chunk's bytes to read if more (a format fetches whole native units)."""
        chunk = self._chunk(piece.chunk)
        rows = chunk.num_rows if self._whole else piece.stop - piece.start
        return max(rows * self.row_bytes, float(chunk.num_bytes))

    def _hint(self, piece: Piece, fmt: Format) -> None:
        """Let ``fmt`` start fetching ``piece``, which it reads next. A hint never fails: what
        went wrong is raised by the piece's own read, at its turn (a file deleted after planning
        once failed the piece read before it, whose read hinted it)."""
        chunk = self._chunk(piece.chunk)
        start, stop = (0, chunk.num_rows) if self._whole else (piece.start, piece.stop)
        with contextlib.suppress(Exception):  # raised again by the piece's own read
            fmt.prefetch(chunk, start, stop, self.fs, self.options)

    def _piece(
        self, piece: Piece, fmt: Format, upcoming: Piece | None = None
    ) -> Iterator[pa.RecordBatch]:
        """The piece's rows read by ``fmt`` (the reader's format, or a thread's copy of it);
        ``upcoming``: the piece read next by ``fmt``, which may start downloading now."""
        chunk = self._chunk(piece.chunk)
        try:
            if upcoming is not None:
                self._hint(piece, fmt)  # (already started, unless this is the first piece)
                self._hint(upcoming, fmt)
            # (Pieces of one file read ahead at once may each check it: a request more, never
            # rows of a file not checked.)
            if chunk.path not in self._checked and not self.fs.checks_identity:
                pinned = self.files.get(chunk.path)
                if pinned is not None:
                    check_identity(chunk.path, pinned, self.fs, since=self._began)
                self._checked.add(chunk.path)
            if not self._whole:
                position = piece.start
                for batch in fmt.read(chunk, piece.start, piece.stop, self.fs, self.options):
                    yield self._finish(batch, chunk, position)
                    position += batch.num_rows
            else:
                yield from self._filtered(piece, chunk, fmt)
        except TorchDataloaderUtilsError:
            raise
        except (ValueError, IndexError, OverflowError, EOFError, pa.ArrowException) as exc:
            # A format let a parser's error through (a UnicodeDecodeError from names that are
            # not UTF-8, an Arrow error from bytes pyarrow rejects): name the file and rows.
            # (TypeError, KeyError and the like are bugs, not bad bytes: they pass as they are.)
            raise CorruptFileError(
                f"{self.fs.url(chunk.path)} (chunk {chunk.start}:{chunk.stop}, rows "
                f"{piece.start}:{piece.stop}): cannot be read: {type(exc).__name__}: {exc}"
            ) from exc

    def _filtered(self, piece: Piece, chunk: Chunk, fmt: Format) -> Iterator[pa.RecordBatch]:
        """Piece rows count rows that pass the filter and the transform: read the chunk,
        filter, transform, then slice."""
        expr, derive = self.options.filter, self.derive
        where = f"{self.fs.url(chunk.path)} (chunk {chunk.start}:{chunk.stop})"
        counted = None
        if derive is not None and derive.counts_rows and self.chunk_rows is not None:
            counted = int(self.chunk_rows[piece.chunk])
        position = kept = 0
        for raw in fmt.read(chunk, 0, chunk.num_rows, self.fs, self.options):
            batch = with_partition(raw, chunk.partition, self.options)
            if expr is not None:
                batch = batch.filter(expr)
            if derive is not None:
                batch = derive.transformed(batch, where)
            lo, hi = max(piece.start - kept, 0), min(piece.stop - kept, batch.num_rows)
            if lo < hi:
                yield self._finish(batch.slice(lo, hi - lo), chunk, position, partitioned=True)
            kept += batch.num_rows
            position += raw.num_rows
            if kept >= piece.stop and (counted is None or piece.stop < counted):
                break
        else:  # (read to its end: a transform's count is checked against the census's)
            if counted is not None and kept != counted:
                name = derive.transform.fingerprint if derive and derive.transform else ""
                raise DataError(
                    f"{where}: the transform {name!r} yielded {kept} rows, the census counted "
                    f"{counted}: a transform must give the same rows every time (change its "
                    "fingerprint when it changes)"
                )

    def _finish(
        self, batch: pa.RecordBatch, chunk: Chunk, position: int, *, partitioned: bool = False
    ) -> pa.RecordBatch:
        if not partitioned:
            batch = with_partition(batch, chunk.partition, self.options)
        if self.derive is not None:
            where = f"{self.fs.url(chunk.path)} (chunk {chunk.start}:{chunk.stop})"
            batch = self.derive.tokenized(batch, where)
        problem = self.check(batch) if self.check is not None else None
        if problem is not None:
            origin = ""
            if problem.error is NullValueError:  # (a text format can name the null's text)
                origin = self.fmt.null_origin(chunk, problem.column, self.fs, self.options)
            raise problem.error(
                f"{self.fs.url(chunk.path)} (chunk {chunk.start}:{chunk.stop}, rows from "
                f"{position}): {problem.reason}" + (f"; the first null: {origin}" if origin else "")
            )
        if self.output_columns is not None:
            batch = batch.select(list(self.output_columns))
        if self.schema is not None:
            target = self._cast_to(batch.schema)
            if target is not None:
                # Not a cast, which aborts the process on some types (a union's nullability): a
                # column under the plan's field as it is, or a view where a child's
                # nullability differs (a view of a sliced union's values is not sound).
                columns = [
                    c if c.type == f.type else c.view(f.type)
                    for c, f in zip(batch.columns, target, strict=True)
                ]
                batch = pa.RecordBatch.from_arrays(columns, schema=target)
        return batch

    def _cast_to(self, schema: pa.Schema) -> pa.Schema | None:
        """The schema batches of ``schema`` are cast to: where a column differs from the plan's
        only as planning lets files differ (`_alike`), the plan's; else None (as read)."""
        for seen, target in self._casts:  # (a few schemas at most; some types do not hash)
            if seen.equals(schema):
                return target
        assert self.schema is not None
        planned = {f.name: f for f in self.schema}
        fields = [
            planned[f.name] if f.name in planned and _alike(f, planned[f.name]) else f
            for f in schema
        ]
        target = pa.schema(fields, metadata=schema.metadata)
        out = None if target.equals(schema) else target
        self._casts.append((schema, out))
        return out


def _alike(read: pa.Field, planned: pa.Field) -> bool:
    """Whether ``read`` is ``planned`` but for nullability and the children's names pickle
    gives (the differences `formats.schemas.check_schemas` accepts between files)."""
    one = portable_schema(pa.schema([read.with_nullable(True)]))
    return bool(one.equals(portable_schema(pa.schema([planned.with_nullable(True)]))))
