"""The IterableDataset: plans once in the main process, resolves its stream in each worker."""

from __future__ import annotations

import dataclasses
import logging
import os
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import torch.distributed as dist
from torch.utils.data import IterableDataset, get_worker_info

from .arguments import check_arguments
from .batching import (
    DEFAULT_SHUFFLE_BLOCK_BYTES,
    BatchOptions,
    Segment,
    block_sizes,
    cut_batches,
    shuffled_blocks,
)
from .convert import Converter, ListFormat, NullPolicy, OutputFormat
from .decoding import Decoding
from .distributed import plan_once
from .errors import DataError, InvalidArgumentError, UnsupportedTypeError
from .formats import Format, ReadOptions, get_format
from .fs import FileSystemSpec, RetryPolicy, Source, StorageBackend, StorageOptions
from .planner import Planned, plan_source
from .planning import (
    Item,
    Layout,
    Piece,
    Plan,
    Remainder,
    Run,
    SplitStrategy,
    Topology,
    assign_stream,
    block_start,
    chunk_order,
    consumed,
    cut,
    epoch_sequence,
    rank_span,
    resolve_rank,
    round_robin_runs,
    run_pieces,
    sequence_length,
    stream_batches,
    stream_runs,
    stream_spans,
)
from .prefetch import Prefetcher
from .reading import Reader
from .skipping import FailureLog, OnError
from .state import (
    Iteration,
    PassControl,
    decode_state,
    decode_stream_state,
    encode_state,
    encode_stream_state,
    is_complete,
)
from .transport import bundle_rows, worker_messages

if TYPE_CHECKING:
    from .loader import TabularDataLoader

__all__ = ["StructuredDataset"]

logger = logging.getLogger(__name__)


@dataclass
class _Reading:
    """The pass this copy of the dataset is reading: where its stream started, what it yielded."""

    iteration: Iteration
    topology: Topology
    start: int  # batches of the stream delivered before this pass began reading
    total: int  # batches of the stream in the pass
    yielded: int = 0


class StructuredDataset(IterableDataset[Any]):
    """Batches of structured data (Parquet, ...) read exactly once per epoch.

    The dataset plans in its constructor (main process): lists the files, reads footers, builds
    the `Plan`. Each time it is iterated it works out
    its own stream from the rank and the real DataLoader worker it runs in, so it never depends
    on the constructor knowing ``num_workers``. It yields whole batches: use it with
    ``DataLoader(batch_size=None)``, or better, `create_dataloader`.

    Args:
        path: a path or URL, a directory, a glob, a brace pattern, or a list of them.
        format: the format name (``"parquet"``, ``"orc"``, ``"csv"``, ``"json"``, ``"ipc"``,
            ``"webdataset"``, or an alias) or a `Format`.
        batch_size: rows per batch.
        columns: columns to read (``None``: all). Partition columns may be named.
        filters: a ``pyarrow.compute.Expression``; prunes row groups at plan time and
            filters rows when reading.
        shuffle: shuffle chunk order per epoch and rows inside blocks.
        shuffle_seed: the seed; with ``set_epoch`` it fixes every epoch's order.
        split_bytes: target compressed bytes per chunk (``None``: one row group per chunk).
        split_rows: target rows per chunk.
        storage_options: options for the fsspec filesystem (credentials, endpoint), or a
            picklable function returning them, called in each process (each DataLoader worker
            too) so that expiring credentials are fetched where they are used.
        partitioning: ``"hive"`` adds ``key=value`` directory columns.
        output_format: ``"torch"`` (default), ``"numpy"``, ``"arrow"`` or ``"dict"``.
        list_format: variable-length lists as ``"padded"`` (default), ``"offsets"``,
            ``"nested"``.
        null_policy: ``"error"`` (default), ``"fill"`` or ``"mask"``.
        pad_value: padding of ``list_format="padded"``.
        drop_last: drop each rank's last short batch.
        shuffle_block_size: rows shuffled together (``None``: about ``shuffle_block_bytes``).
        shuffle_block_bytes: decoded bytes shuffled together when ``shuffle_block_size`` is
            ``None``; bounds memory per worker.
        rank: data-parallel rank (default: from torch.distributed, else ``RANK``, else 0).
        world_size: data-parallel ranks (default: likewise, else 1).
        remainder: rows that do not divide among ranks: ``"drop"`` (default), ``"pad"``
            (wrap to the start), ``"uneven"``.
        split_strategy: ``"equal"`` (default: equal streams cut at rows) or ``"round_robin"``
            (the earlier library's: whole chunks dealt to workers in turn; unequal streams).
        collate_fn: applied to every batch after conversion, in the worker.
        num_ranks: the earlier library's name for ``world_size``.
        storage_backend: ``"auto"`` (default): pyarrow's native S3/GCS/Azure filesystem where
            the protocol has one and every storage option translates to it, else fsspec;
            ``"arrow"`` or ``"fsspec"`` force one. Results are the same either way.
        retries: how storage requests are retried: a `RetryPolicy`, or a number of retries
            (default: `RetryPolicy()`, 5 retries with capped, jittered exponential backoff).
        format_options: keyword arguments of the format named by ``format`` (for example
            ``{"delimiter": ";"}`` for CSV, ``{"missing_component": "skip"}`` for WebDataset);
            see docs/reference/formats.
        on_error: ``"raise"`` (default): a chunk that cannot be read raises an error naming
            the file and rows. ``"skip"``: its rows are left out, their places taken by copies
            of rows read before them (every rank keeps its batch count), and each failure is
            logged and counted (`TabularDataLoader.read_failures`); see docs/adr/0011.

    Raises:
        UnknownFormatError: ``format`` is not registered.
        StorageNotFoundError: ``path`` does not exist.
        ColumnNotFoundError: a column in ``columns`` or ``filters`` is not in the data.
        FilterTypeError: ``filters`` is not a ``pyarrow.compute.Expression``.
        CorruptFileError: a file cannot be parsed.
        SchemaMismatchError: files disagree on the schema of the columns read.
        UnsupportedTypeError: a column has no mapping to ``output_format``.

    Examples:
        >>> loader, dataset = StructuredDataset.create_dataloader(  # doctest: +SKIP
        ...     path="data/", format="parquet", batch_size=1024, shuffle=True, num_workers=2)
        >>> for epoch in range(3):  # doctest: +SKIP
        ...     dataset.set_epoch(epoch)
        ...     for batch in loader:
        ...         ...
    """

    def __init__(
        self,
        path: Source,
        format: str | Format = "parquet",
        *,
        batch_size: int = 1024,
        columns: Sequence[str] | None = None,
        filters: Any = None,
        shuffle: bool = False,
        shuffle_seed: int = 42,
        split_bytes: int | None = None,
        split_rows: int | None = None,
        storage_options: StorageOptions | None = None,
        partitioning: str | None = None,
        output_format: OutputFormat = "torch",
        list_format: ListFormat = "padded",
        null_policy: NullPolicy = "error",
        pad_value: int | float = 0,
        drop_last: bool = False,
        shuffle_block_size: int | None = None,
        shuffle_block_bytes: int = DEFAULT_SHUFFLE_BLOCK_BYTES,
        rank: int | None = None,
        world_size: int | None = None,
        remainder: Remainder = "drop",
        split_strategy: SplitStrategy = "equal",
        collate_fn: Callable[[Any], Any] | None = None,
        num_ranks: int | None = None,
        storage_backend: StorageBackend = "auto",
        retries: RetryPolicy | int | None = None,
        format_options: Mapping[str, Any] | None = None,
        on_error: OnError = "raise",
    ) -> None:
        super().__init__()
        world_size = check_arguments(
            batch_size=batch_size,
            columns=columns,
            shuffle_seed=shuffle_seed,
            split_bytes=split_bytes,
            split_rows=split_rows,
            partitioning=partitioning,
            shuffle_block_size=shuffle_block_size,
            shuffle_block_bytes=shuffle_block_bytes,
            world_size=world_size,
            remainder=remainder,
            split_strategy=split_strategy,
            num_ranks=num_ranks,
            on_error=on_error,
        )
        self.format = get_format(format, format_options)
        self.fs = self._filesystem(
            path, storage_options, backend=storage_backend, retry=RetryPolicy.of(retries)
        )
        self.batch_size = batch_size
        self.shuffle = shuffle
        self.shuffle_seed = shuffle_seed
        self.drop_last = drop_last
        self.remainder: Remainder = remainder
        self.split_strategy: SplitStrategy = split_strategy
        self.collate_fn = collate_fn
        self.on_error: OnError = on_error
        self._failures: FailureLog | None = None  # this process's, made when first used
        self._rank = rank
        self._world_size = world_size
        # The rank of the process this copy was pickled in, for its DataLoader workers (a
        # spawned worker has no process group); None where that process had no rank.
        self._inherited_rank: tuple[int, int] | None = None
        if rank is not None or world_size is not None:
            resolve_rank(rank, world_size)  # validate now, before any worker starts
            Topology(rank or 0, world_size or 1)
        # The epoch and passes, shared with this rank's DataLoader workers (persistent ones
        # too): see `PassControl` for the epoch rule.
        self.passes = PassControl()
        self._pending: Iteration | None = None  # a loaded state, for the next pass
        self._pending_complete = False  # ... whose epoch was complete
        self._iteration: Iteration | None = None  # the pass the main process began last
        self._claimed = True
        self._stream_resume: dict[str, Any] | None = None  # a worker's loaded stream state
        self._reading: _Reading | None = None

        # Listing, footers and row counting happen once: on rank 0 when torch.distributed is up
        # (the others receive the result), else here.
        planned = plan_once(
            lambda: self._plan_source(
                path,
                columns=columns,
                filters=filters,
                partitioning=partitioning,
                split_bytes=split_bytes,
                split_rows=split_rows,
            ),
            explicit=rank is not None,
        )
        if planned.format is not None:
            self.format = planned.format  # on ranks > 0: the format rank 0 planned with
        self.read_options: ReadOptions = planned.read_options
        self.plan: Plan = planned.plan
        self._output_columns = planned.output_columns
        try:
            self.converter = Converter(
                self.plan.schema,
                output_format=output_format,
                list_format=list_format,
                null_policy=null_policy,
                pad_value=pad_value,
            )
        except UnsupportedTypeError as exc:  # at planning: name the source
            where = (
                os.fspath(path)
                if isinstance(path, str | os.PathLike)
                else ", ".join(str(p) for p in path)
            )
            raise UnsupportedTypeError(f"{where}: {exc}") from None
        self.block_rows, self.first_block_rows = block_sizes(
            batch_size=batch_size,
            block_size=shuffle_block_size,
            block_bytes=shuffle_block_bytes,
            row_bytes=max(self.plan.row_bytes, planned.decoded_row_bytes),
        )
        if (
            split_strategy == "round_robin"
            and remainder != "uneven"
            and resolve_rank(rank, world_size)[1] > 1
        ):
            raise InvalidArgumentError(
                'split_strategy="round_robin" with several ranks: it deals whole chunks, so '
                "ranks get unequal batch counts, which hangs DDP at the last collective. Use "
                'the default split_strategy="equal", or pass remainder="uneven" to accept '
                "unequal ranks (and use join())"
            )
        decoders = self.format.decoders(self.plan.schema) if output_format != "arrow" else {}
        self._collate = (
            Decoding(decoders, output_format=output_format, collate=collate_fn, on_error=on_error)
            if decoders
            else collate_fn
        )
        logger.info("%s", self.plan.summary())

    # --- planning (subclasses read other sources: IcebergDataset) ------------------------------

    def _filesystem(
        self,
        path: Source,
        storage_options: StorageOptions | None,
        *,
        backend: StorageBackend,
        retry: RetryPolicy,
    ) -> FileSystemSpec:
        """The filesystem the data lives on (from the first path's protocol)."""
        first = os.fspath(path if isinstance(path, str | os.PathLike) else next(iter(path), ""))
        return FileSystemSpec.for_path(first, storage_options, backend=backend, retry=retry)

    def _plan_source(
        self,
        path: Source,
        *,
        columns: Sequence[str] | None,
        filters: Any,
        partitioning: str | None,
        split_bytes: int | None,
        split_rows: int | None,
    ) -> Planned:
        """Plan the source: list, read footers, count filtered rows (`plan_source`)."""
        return plan_source(
            path,
            self.format,
            self.fs,
            columns=columns,
            filters=filters,
            partitioning=partitioning,
            split_bytes=split_bytes,
            split_rows=split_rows,
        )

    @property
    def storage_retries(self) -> int:
        """Storage requests retried so far, in this process and its DataLoader workers (each
        retry is also logged at WARNING on the ``torch_dataloader_utils.storage`` logger)."""
        return self.fs.retries.total

    # --- epochs and passes -----------------------------------------------------------------------

    def set_epoch(self, epoch: int) -> None:
        """Set the epoch of the next pass: with ``shuffle=True`` each epoch has its own order.

        It reaches persistent workers. Without it, a pass that follows a pass which delivered a
        batch reads the next epoch; an explicit epoch always wins. A loaded state for another
        epoch is dropped.
        """
        if epoch < 0:
            raise InvalidArgumentError(f"epoch must be >= 0, got {epoch}")
        self.passes.set_epoch(epoch)
        pending = self._pending
        if pending is not None and pending.epoch != epoch:
            self._pending = None
            if pending.resumed and not self._pending_complete:
                warnings.warn(
                    f"set_epoch({epoch}) drops the loaded state, which was in the middle of "
                    f"epoch {pending.epoch}: the rest of that epoch will not be read. Call "
                    f"set_epoch({pending.epoch}) first to finish it",
                    stacklevel=2,
                )

    @property
    def epoch(self) -> int:
        """The epoch set with `set_epoch`, or of the pass begun last."""
        return self.passes.epoch

    @property
    def resume_pending(self) -> Iteration | None:
        """The pass a loaded state will resume, until the next pass begins."""
        return self._pending

    @property
    def pending_complete(self) -> bool:
        """Whether the loaded state (`resume_pending`) had delivered its whole epoch."""
        return self._pending is not None and self._pending_complete

    def layout(self) -> Layout:
        """The options that decide which rows each stream reads and in what order."""
        return Layout(
            batch_size=self.batch_size,
            shuffle=self.shuffle,
            seed=self.shuffle_seed,
            drop_last=self.drop_last,
            remainder=self.remainder,
            block_rows=self.block_rows,
            first_block_rows=self.first_block_rows,
            strategy=self.split_strategy,
        )

    def begin_iteration(self) -> Iteration:
        """Begin a pass over the current epoch (main process): a loaded state, or a fresh one.

        Workers receive the returned object with the dataset and apply it only to this pass.
        """
        return self._begin(for_workers=True)

    def _begin(self, *, for_workers: bool) -> Iteration:
        epoch, generation = self.passes.begin(for_workers=for_workers)
        pending, self._pending = self._pending, None
        if pending is not None and pending.epoch == epoch:
            iteration = Iteration(pending.epoch, pending.legs, pending.batches, generation)
            if self._pending_complete:
                self.passes.delivered()  # a complete epoch: the pass after it reads the next
        else:
            iteration = Iteration(epoch, generation=generation)
        self._iteration, self._claimed = iteration, not for_workers
        return iteration

    def _this_iteration(self, topology: Topology) -> tuple[Iteration, int | None]:
        """The pass this process reads, and the batches its stream already delivered (None:
        as the pass's rank-level position says)."""
        if get_worker_info() is None:
            if self._iteration is not None and not self._claimed:
                self._claimed = True  # begun by a TabularDataLoader for this pass
                return self._iteration, None
            return self._begin(for_workers=False), None
        loaded, self._stream_resume = self._stream_resume, None
        if loaded is not None:  # a StatefulDataLoader gave this worker its saved state
            iteration, done = decode_stream_state(
                loaded,
                self.plan,
                world_size=topology.world_size,
                num_workers=topology.num_workers,
                worker=topology.worker,
                layout=self.layout(),
            )
            self.passes.begin_worker(topology.worker, iteration.epoch)
            return iteration, done
        epoch = self.passes.begin_worker(topology.worker)
        generation = self.passes.generation
        if epoch is not None:  # a pass no main process began (a plain DataLoader's)
            return Iteration(epoch, generation=generation), None
        mine = self._iteration  # this copy of the pass the main process began, if it is this one
        if mine is not None and mine.generation == generation:
            return mine, None
        return Iteration(self.epoch, generation=generation), None

    # --- resume ---------------------------------------------------------------------------------

    def state_at(self, iteration: Iteration, *, num_workers: int, complete: bool) -> dict[str, Any]:
        """The loader state of ``iteration`` (see `TabularDataLoader.state_dict`)."""
        return encode_state(
            self.plan,
            iteration,
            world_size=self.resolved_rank()[1],
            num_workers=max(1, num_workers),
            layout=self.layout(),
            complete=complete,
        )

    def load_state(
        self, state: dict[str, Any], *, num_workers: int, allow_changed_data: bool = False
    ) -> Iteration:
        """Make the next pass resume ``state``; returns that pass (see `decode_state`)."""
        iteration = decode_state(
            state,
            self.plan,
            world_size=self.resolved_rank()[1],
            num_workers=max(1, num_workers),
            layout=self.layout(),
            allow_changed_data=allow_changed_data,
        )
        self._pending = iteration
        self._pending_complete = is_complete(state)
        # A complete epoch: the next pass reads the next epoch (as a StatefulDataLoader's
        # finished state does, which Lightning relies on), unless set_epoch(its epoch) asks
        # for the (empty) rest of it.
        self.passes.set_epoch(iteration.epoch, advance=self._pending_complete)
        return iteration

    # --- torchdata's Stateful protocol (StatefulDataLoader(dataset, batch_size=None)) ----------

    def state_dict(self) -> dict[str, Any]:
        """Where this copy of the dataset stands (torchdata's ``Stateful`` protocol).

        In the main process (``num_workers=0``): the loader state of the pass read in-process,
        which resumes on any topology, as `TabularDataLoader.state_dict`'s does. In a
        DataLoader worker: the state of that worker's stream, which ``StatefulDataLoader``
        keeps per worker and gives back to the same worker on resume (a seek, no replay).
        """
        reading = self._reading
        info = get_worker_info()
        if info is None:
            if self._pending is not None:
                return self.state_at(self._pending, num_workers=1, complete=self._pending_complete)
            if reading is None or reading.iteration.epoch != self.epoch:
                return self.state_at(Iteration(self.epoch), num_workers=1, complete=False)
            now = Iteration(
                reading.iteration.epoch, reading.iteration.legs, reading.start + reading.yielded
            )
            complete = reading.start + reading.yielded >= reading.total
            return self.state_at(now, num_workers=1, complete=complete)
        started = reading is not None
        if reading is None:  # asked before this worker began a pass: the next one, unread
            rank, world_size = self.resolved_rank()
            reading = _Reading(
                Iteration(self.epoch), Topology(rank, world_size, info.id, info.num_workers), 0, 0
            )
        done = reading.start + reading.yielded
        return encode_stream_state(
            self.plan,
            reading.iteration,
            world_size=reading.topology.world_size,
            num_workers=reading.topology.num_workers,
            worker=reading.topology.worker,
            batches=done,
            layout=self.layout(),
            complete=started and done >= reading.total,
        )

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Resume from ``state_dict`` on the next pass (torchdata's ``Stateful`` protocol).

        Raises:
            StateMismatchError: the state does not fit this data or this topology.
        """
        if get_worker_info() is None:
            self.load_state(state_dict, num_workers=1)
        else:
            self._stream_resume = state_dict  # checked when the worker's pass begins

    # --- the stream of one worker ---------------------------------------------------------------

    def topology(self) -> Topology:
        """The topology of the calling process (rank, and the DataLoader worker it runs in)."""
        rank, world_size = self.resolved_rank()
        return Topology(rank, world_size).with_worker()

    def resolved_rank(self) -> tuple[int, int]:
        """``(rank, world_size)`` of the calling process, resolved now.

        Explicit ``rank=``/``world_size=`` win; then this process's ``torch.distributed``
        group; then the rank of the process this copy was pickled in (a spawned DataLoader
        worker has no group of its own); then ``RANK``/``WORLD_SIZE``; else a single rank.
        """
        if self._rank is not None or self._world_size is not None:
            return resolve_rank(self._rank, self._world_size)
        if dist.is_available() and dist.is_initialized():
            return dist.get_rank(), dist.get_world_size()
        if self._inherited_rank is not None:
            return self._inherited_rank
        return resolve_rank(None, None)

    def _order(self, iteration: Iteration) -> tuple[list[int], list[int]]:
        """The epoch's chunk order and the rows of each chunk in that order."""
        first = iteration.legs[0].layout if iteration.legs else self.layout()
        order = chunk_order(
            len(self.plan.chunks), seed=first.seed, epoch=iteration.epoch, shuffle=first.shuffle
        )
        rows = self.plan.chunk_rows
        return [int(i) for i in order], [rows[i] for i in order]

    def _sequence(self, iteration: Iteration) -> list[Item]:
        return epoch_sequence(self.plan.num_rows, iteration.legs, epoch=iteration.epoch)

    def _streams(self, iteration: Iteration, rank: Topology) -> list[int]:
        """Rows of each worker's stream of ``rank`` (its ``num_workers`` set) in ``iteration``."""
        layout = self.layout()
        if self.split_strategy == "round_robin":
            _, rows = self._order(iteration)
            streams = (
                Topology(rank.rank, rank.world_size, w, rank.num_workers)
                for w in range(rank.num_workers)
            )
            return [sequence_length(round_robin_runs(rows, t)) for t in streams]
        total = sequence_length(self._sequence(iteration))
        spans = stream_spans(
            total,
            rank=rank.rank,
            world_size=rank.world_size,
            num_workers=rank.num_workers,
            layout=layout,
        )
        return [b - a for a, b in spans]

    def worker_batches(self, iteration: Iteration, num_workers: int) -> tuple[list[int], list[int]]:
        """Batches of each worker's stream of this rank, and how many each already delivered."""
        rank, world_size = self.resolved_rank()
        counts = stream_batches(
            self._streams(iteration, Topology(rank, world_size, 0, max(1, num_workers))),
            self.layout(),
        )
        return counts, consumed(counts, iteration.batches)

    def stream(self, topology: Topology, iteration: Iteration) -> list[Run]:
        """The runs of the epoch's sequence that ``topology``'s stream reads in ``iteration``."""
        if self.split_strategy == "round_robin":
            return round_robin_runs(self._order(iteration)[1], topology)
        return stream_runs(
            self._sequence(iteration),
            topology,
            batch_size=self.batch_size,
            drop_last=self.drop_last,
            remainder=self.remainder,
        )

    def pieces(self, topology: Topology, epoch: int) -> list[Piece]:
        """The pieces ``topology``'s stream reads in a fresh pass over ``epoch``."""
        return assign_stream(
            self.plan.chunk_rows,
            topology,
            epoch=epoch,
            seed=self.shuffle_seed,
            shuffle=self.shuffle,
            batch_size=self.batch_size,
            drop_last=self.drop_last,
            remainder=self.remainder,
            strategy=self.split_strategy,
        )

    def segments(
        self, topology: Topology, iteration: Iteration | int, *, done: int | None = None
    ) -> Iterator[Segment]:
        """The batches of ``topology``'s stream before conversion, each a record batch and the
        indices of its rows in output order (``None``: all, in order).

        ``iteration`` is a pass (a resumed one starts where it says) or an epoch (fresh);
        ``done``, the batches the stream already delivered (default: as the pass says).
        """
        if isinstance(iteration, int):
            iteration = Iteration(iteration)
        layout = self.layout()
        runs = self.stream(topology, iteration)
        length = sequence_length(runs)
        if done is None:
            done = self._stream_done(topology, iteration)
        start = min(done * self.batch_size, length)
        _, first = block_start(length, start, layout)
        order, rows = self._order(iteration)
        parts = (run_pieces(run, rows, order) for run in cut(runs, first, length))
        reader = Reader(
            self.plan.chunks,
            self.format,
            self.fs,
            self.read_options,
            output_columns=self._output_columns,
            check=self.converter.check,
            files=self.plan.files,
            on_error=self.on_error,
            failures=self.failure_log,
        )
        options = BatchOptions(
            batch_size=self.batch_size,
            shuffle=self.shuffle,
            block_rows=layout.block_rows,
            first_block_rows=layout.first_block_rows,
            seed=self.shuffle_seed,
        )
        blocks = shuffled_blocks(
            reader.read(parts),
            length,
            options,
            epoch=iteration.epoch,
            stream=topology.stream,
            leg=len(iteration.legs),
            start=start,
        )
        # The thread reads and assembles whole blocks while this one gathers, converts
        # and packs the previous block. A queue of read batches instead let the reader get only
        # a little ahead of a block, and the two alternated (measured: ~25% of a worker idle).
        # Memory: the block being gathered and the next one being assembled.
        ahead = Prefetcher(blocks, depth=1 if self.shuffle else 4)
        # Streams are batch-aligned, so drop_last already left only whole batches, except
        # round-robin's streams of whole chunks.
        unaligned = self.split_strategy != "equal"
        try:
            yield from cut_batches(ahead, self.batch_size, drop_short=self.drop_last and unaligned)
        except pa.ArrowInvalid as exc:
            if "overflow" not in str(exc):
                raise
            # A string, binary or list column's 32-bit offsets cannot hold the block or batch.
            raise DataError(
                f"{', '.join(reader.recent_files())}: a shuffle block or batch of these rows "
                "holds more than 2 GiB in one string, binary or list column, more than its "
                f"32-bit offsets address ({exc}); read with a smaller batch_size (and "
                "shuffle_block_bytes), or write the column as large_string/large_binary"
            ) from exc

    def _stream_done(self, topology: Topology, iteration: Iteration) -> int:
        """Batches ``topology``'s stream delivered before ``iteration`` began (a resume)."""
        counts = stream_batches(self._streams(iteration, topology), self.layout())
        return consumed(counts, iteration.batches)[topology.worker]

    def __iter__(self) -> Iterator[Any]:
        # Not a generator: the pass (its epoch, its start) is fixed when iter() is called, as
        # torchdata's StatefulDataLoader asks a worker's state right after iter(dataset).
        topology = self.topology()
        iteration, done = self._this_iteration(topology)
        counts = stream_batches(self._streams(iteration, topology), self.layout())
        if done is None:
            done = consumed(counts, iteration.batches)[topology.worker]
        reading = _Reading(iteration, topology, done, counts[topology.worker])
        self._reading = reading
        return self._read(reading)

    def _read(self, reading: _Reading) -> Iterator[Any]:
        topology = reading.topology
        in_main = get_worker_info() is None
        if not in_main:
            self.failure_log.relayed = bundle_rows() > 0  # a TabularDataLoader's worker
        collate = self._collate
        if isinstance(collate, Decoding) and self.on_error == "skip":
            collate = dataclasses.replace(collate, failures=self.failure_log)
        messages = worker_messages(
            self.segments(topology, reading.iteration, done=reading.start),
            self.converter,
            collate,
            worker=topology.worker,
            batch_size=self.batch_size,
            failures=None if in_main else self.failure_log,
        )
        for message in messages:
            # Counts messages, which are batches outside a TabularDataLoader's workers (whose
            # loader keeps the state in the main process).
            reading.yielded += 1
            if in_main and reading.yielded == 1:
                self.passes.delivered()
            yield message

    @property
    def failure_log(self) -> FailureLog:
        """The reads this process skipped under ``on_error="skip"`` and has not reported yet
        (a DataLoader worker's go to the main process with its batches)."""
        if self._failures is None:
            self._failures = FailureLog()
        return self._failures

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_reading"] = None
        state["_failures"] = None  # each process its own
        if self._rank is None and self._world_size is None:
            # Pickled for a spawned DataLoader worker, which will not have this process's
            # torch.distributed group: it takes the rank resolved here. A process with no rank
            # (no group, no RANK: the parent of mp.spawn, ddp_spawn or Ray ranks) leaves the
            # rank to be resolved where the copy lands.
            has_rank = (dist.is_available() and dist.is_initialized()) or "RANK" in os.environ
            state["_inherited_rank"] = self.resolved_rank() if has_rank else self._inherited_rank
        return state

    def __len__(self) -> int:
        """Batches this rank yields per epoch (whatever the number of workers).

        Raises:
            TypeError: the count depends on the number of workers
                (``split_strategy="round_robin"``).
        """
        if self.split_strategy != "equal":
            raise TypeError('the number of batches depends on the workers with "round_robin"')
        rank, world_size = self.resolved_rank()
        start, stop = rank_span(
            self.plan.num_rows,
            rank=rank,
            world_size=world_size,
            batch_size=self.batch_size,
            drop_last=self.drop_last,
            remainder=self.remainder,
        )
        return (stop - start + self.batch_size - 1) // self.batch_size

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(format={self.format.name!r}, fs={self.fs!r}, "
            f"chunks={len(self.plan.chunks)}, rows={self.plan.num_rows}, "
            f"batch_size={self.batch_size}, shuffle={self.shuffle})"
        )

    @classmethod
    def create_dataloader(
        cls, path: Source, format: str | Format = "parquet", **kwargs: Any
    ) -> tuple[TabularDataLoader, StructuredDataset]:
        """Build the dataset and a DataLoader over it; see `create_dataloader`.

        Returns:
            ``(loader, dataset)``: call ``dataset.set_epoch(epoch)`` before each epoch.
        """
        from .loader import create_dataloader

        loader = create_dataloader(path, format=format, dataset_class=cls, **kwargs)
        return loader, loader.dataset
