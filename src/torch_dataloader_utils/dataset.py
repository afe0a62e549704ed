"""The IterableDataset: plans once in the main process, resolves its stream in each worker."""

from __future__ import annotations

import dataclasses
import logging
import os
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import pyarrow as pa
from torch.utils.data import IterableDataset, get_worker_info

from .cache import CacheConfig, CacheCounter, CacheStats, CachingFileSystem, open_store
from .convert import Converter, Decoding, ListFormat, NullPolicy, OutputFormat
from .errors import InvalidArgumentError, UnsupportedTypeError
from .formats import Format, ReadOptions, get_format
from .fs import FileSystemSpec, RetryPolicy, Source, StorageBackend, StorageOptions
from .options import check_arguments, check_dataset_keywords
from .planning import (
    Iteration,
    Layout,
    Piece,
    Plan,
    Ranks,
    Remainder,
    SplitStrategy,
    Topology,
    strategy_of,
)
from .skipping import FailureLog, OnError
from .sources.broadcast import plan_once
from .sources.files import Planned, plan_source
from .state import Passes, Progress
from .stream.blocks import DEFAULT_SHUFFLE_BLOCK_BYTES, Segment, block_sizes
from .stream.pipeline import stream_segments
from .stream.read import Reader
from .stream.resolve import resolve
from .transport import bundle_rows, worker_messages

if TYPE_CHECKING:
    from .loader import TabularDataLoader

__all__ = ["StructuredDataset"]

logger = logging.getLogger(__name__)


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
        cache_dir: a node-local directory where what is read from object storage is kept
            (byte ranges of the files, footers, tar indexes), shared by every rank and worker
            on the machine, so later epochs and runs read it from disk (docs/how-to/cache.md).
            Default: ``$TDU_CACHE_DIR``, else no cache; ``""`` turns it off. Local files are
            never cached.
        cache_limit: bytes the cache may hold: an int or ``"50GB"``, ``"512MiB"`` (default:
            ``$TDU_CACHE_LIMIT``, else what the disk holds while a tenth of it stays free).

    Raises:
        UnknownKeywordError: a keyword this class (and `create_dataloader`) does not take;
            the message names the closest valid one.
        InvalidArgumentError: an option is out of range or of the wrong kind.
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

    def __new__(cls, *args: Any, **kwargs: Any) -> StructuredDataset:
        # Before __init__ binds them: Python's own error would name no valid keyword.
        check_dataset_keywords(cls, kwargs)
        return super().__new__(cls)

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
        cache_dir: str | os.PathLike[str] | None = None,
        cache_limit: int | str | None = None,
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
            shuffle=shuffle,
            drop_last=drop_last,
        )
        self.format = get_format(format, format_options)
        self.fs = self._filesystem(
            path, storage_options, backend=storage_backend, retry=RetryPolicy.of(retries)
        )
        self.collate_fn = collate_fn
        self.on_error: OnError = on_error
        self._failures: FailureLog | None = None  # this process's, made when first used
        self._ranks = Ranks(rank, world_size)  # validates an explicit rank now
        self._reading: Progress | None = None  # the pass this process reads
        self._use_cache(cache_dir, cache_limit)

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
        if planned.fs is not None:  # storage found by planning (an Iceberg table's), read
            self.fs = planned.fs.under(self.fs)  # with this rank's options, backend, retries
        self.read_options: ReadOptions = planned.read_options
        self.plan: Plan = planned.plan
        self._output_columns = planned.output_columns
        decoders = self.format.decoders(self.plan.schema) if output_format != "arrow" else {}
        # Read with decoded columns, so that a value that does not decode is named by its
        # file and sample whatever the columns asked for; dropped after decoding.
        self._carried = tuple(
            c for c in self.format.sample_columns if decoders and c not in self.plan.schema.names
        )
        try:
            self.converter = Converter(
                pa.schema([*self.plan.schema, *(pa.field(c, pa.string()) for c in self._carried)]),
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
        block_rows, first_block_rows = block_sizes(
            batch_size=batch_size,
            block_size=shuffle_block_size,
            block_bytes=shuffle_block_bytes,
            row_bytes=max(self.plan.row_bytes, planned.decoded_row_bytes),
            chunk_rows=self.plan.num_rows / max(len(self.plan.chunks), 1),
        )
        # Every option that decides which rows each stream reads and in what order.
        self.layout = Layout(
            batch_size=batch_size,
            shuffle=shuffle,
            seed=shuffle_seed,
            drop_last=drop_last,
            remainder=remainder,
            block_rows=block_rows,
            first_block_rows=first_block_rows,
            strategy=split_strategy,
        )
        strategy_of(split_strategy).check(self.layout, self._ranks)
        # The epoch and passes, shared with this rank's DataLoader workers (persistent ones
        # too) and with the loader: see `Passes`.
        self.passes = Passes(self.plan, self.layout, self._ranks)
        self._collate = (
            Decoding(
                decoders,
                output_format=output_format,
                collate=collate_fn,
                on_error=on_error,
                carried=self._carried,
            )
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
            cached=self._cached if self.cache is not None else None,
        )

    # --- the node-local cache ------------------------------------------------------------------

    # Whether the source never rewrites a file under its name (an Iceberg table's data files):
    # then a file's size alone identifies it for the cache.
    _immutable_files = False

    def _use_cache(
        self, cache_dir: str | os.PathLike[str] | None, cache_limit: int | str | None
    ) -> None:
        """Set up the node-local cache (``cache_dir``, else ``TDU_CACHE_DIR``; none: off)."""
        self.cache: CacheConfig | None = CacheConfig.of(cache_dir, cache_limit)
        self._cache_counter = CacheCounter() if self.cache is not None else None
        if self.cache is not None:
            open_store(self.cache)  # a directory that cannot be made fails here, named

    def _cached(
        self, fs: FileSystemSpec, files: Mapping[str, tuple[int, str]], *, trusted: bool = False
    ) -> FileSystemSpec:
        """``fs`` with its reads of ``files`` through the cache (remote storage only)."""
        if self.cache is None or fs.is_local:
            return fs
        assert self._cache_counter is not None
        return CachingFileSystem(
            fs,
            self.cache,
            self._cache_counter,
            files,
            immutable=self._immutable_files,
            trusted=trusted,
        )

    @property
    def cache_stats(self) -> CacheStats | None:
        """What the node-local cache did for this dataset so far (every process, planning
        included); None without a cache."""
        return None if self._cache_counter is None else self._cache_counter.snapshot()

    @property
    def storage_retries(self) -> int:
        """Storage requests retried so far, in this process and its DataLoader workers (each
        retry is also logged at WARNING on the ``torch_dataloader_utils.storage`` logger)."""
        return self.fs.retries.total

    # --- epochs and passes (kept by `Passes`, shared with the loader) --------------------------

    def set_epoch(self, epoch: int) -> None:
        """Set the epoch of the next pass: with ``shuffle=True`` each epoch has its own order.

        It reaches persistent workers. Without it, a pass that follows a pass which delivered a
        batch reads the next epoch; an explicit epoch always wins. A loaded state for another
        epoch is dropped.
        """
        if epoch < 0:
            raise InvalidArgumentError(f"epoch must be >= 0, got {epoch}")
        self.passes.set_epoch(epoch)

    @property
    def epoch(self) -> int:
        """The epoch set with `set_epoch`, or of the pass begun last."""
        return self.passes.epoch

    # --- torchdata's Stateful protocol (StatefulDataLoader(dataset, batch_size=None)) ----------

    def state_dict(self) -> dict[str, Any]:
        """Where this copy of the dataset stands (torchdata's ``Stateful`` protocol).

        In the main process (``num_workers=0``): the loader state of the pass read in-process,
        which resumes on any topology, as `TabularDataLoader.state_dict`'s does. In a
        DataLoader worker: the state of that worker's stream, which ``StatefulDataLoader``
        keeps per worker and gives back to the same worker on resume (a seek, no replay).
        """
        if get_worker_info() is None:
            return self.passes.position(self._reading, num_workers=1)
        topology = self._reading.topology if self._reading is not None else self.topology()
        return self.passes.stream_state(self._reading, topology)

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Resume from ``state_dict`` on the next pass (torchdata's ``Stateful`` protocol).

        Raises:
            StateMismatchError: the state does not fit this data or this topology.
        """
        if get_worker_info() is None:
            self.passes.load_state(state_dict, num_workers=1)
        else:
            self.passes.load_stream_state(state_dict)  # checked when the worker's pass begins

    # --- the stream of one worker ---------------------------------------------------------------

    def topology(self) -> Topology:
        """The topology of the calling process (rank, and the DataLoader worker it runs in)."""
        rank, world_size = self.resolved_rank()
        return Topology(rank, world_size).with_worker()

    def resolved_rank(self) -> tuple[int, int]:
        """``(rank, world_size)`` of the calling process, resolved now (see `Ranks`)."""
        return self._ranks.resolve()

    def pieces(self, topology: Topology, epoch: int) -> list[Piece]:
        """The pieces ``topology``'s stream reads in a fresh pass over ``epoch``."""
        stream = resolve(self.plan.chunk_rows, self.layout, Iteration(epoch), topology, done=0)
        return stream.epoch.pieces(stream.runs)

    def reader(self, failures: FailureLog | None = None, *, carry: bool = False) -> Reader:
        """A reader of this dataset's plan; its skipped reads go to ``failures`` (default: this
        process's `failure_log`). ``carry``: its batches also hold the columns that name a
        sample (`Format.sample_columns`) for this dataset's decoding to name bad values."""
        options, output = self.read_options, self._output_columns
        if carry and self._carried and options.columns is not None and output is not None:
            options = dataclasses.replace(options, columns=(*options.columns, *self._carried))
            output = (*output, *self._carried)
        return Reader(
            self.plan.chunks,
            self.format,
            self._cached(self.fs, self.plan.files),
            options,
            output_columns=output,
            check=self.converter.check,
            files=self.plan.files,
            on_error=self.on_error,
            failures=self.failure_log if failures is None else failures,
            row_bytes=self.plan.row_bytes,
        )

    def _segments(self, stream: Any) -> Iterator[Segment]:
        """The batches of ``stream`` before conversion, from where its pass starts."""
        return stream_segments(stream, self.reader(carry=True))

    def __iter__(self) -> Iterator[Any]:
        # Not a generator: the pass (its epoch, its start) is fixed when iter() is called, as
        # torchdata's StatefulDataLoader asks a worker's state right after iter(dataset).
        topology = self.topology()
        iteration, done = self.passes.this_pass(topology)
        stream = self._resolve(iteration, topology, done)
        reading = Progress(iteration, stream.done, stream.batches, topology)
        self._reading = reading
        return self._read(stream, reading)

    def _resolve(self, iteration: Iteration, topology: Topology, done: int | None) -> Any:
        """The stream ``topology`` reads in ``iteration`` (a `Stream`; a mixture's differs)."""
        return resolve(self.plan.chunk_rows, self.layout, iteration, topology, done=done)

    def _read(self, stream: Any, reading: Progress) -> Iterator[Any]:
        in_main = get_worker_info() is None
        if not in_main:
            self.failure_log.relayed = bundle_rows() > 0  # a TabularDataLoader's worker
        collate = self._collate
        if isinstance(collate, Decoding) and self.on_error == "skip":
            collate = dataclasses.replace(collate, failures=self.failure_log)
        messages = worker_messages(
            self._segments(stream),
            self.converter,
            collate,
            worker=stream.topology.worker,
            batch_size=self.batch_size,
            failures=None if in_main else self.failure_log,
        )
        # Counts messages, which are batches outside a TabularDataLoader's workers (whose
        # loader keeps the state in the main process). In the main process, the first makes
        # the next pass read the next epoch.
        if in_main:
            yield from self.passes.counted(messages, reading)
            return
        for message in messages:
            reading.delivered += 1
            yield message

    @property
    def failure_log(self) -> FailureLog:
        """The reads this process skipped under ``on_error="skip"`` and has not reported yet
        (a DataLoader worker's go to the main process with its batches)."""
        if self._failures is None:
            self._failures = FailureLog()
        return self._failures

    @property
    def finish(self) -> Callable[[Any], Any] | None:
        """The conversion step that runs in the main process on a worker's batch (nested
        tensors are built there), or ``None``."""
        if self.converter.list_format == "nested":
            return self.converter.finish_torch
        return None

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_reading"] = None
        state["_failures"] = None  # each process its own
        return state

    def __len__(self) -> int:
        """Batches this rank yields per epoch (whatever the number of workers).

        Raises:
            TypeError: the count depends on the number of workers
                (``split_strategy="round_robin"``).
        """
        rank, world_size = self.resolved_rank()
        strategy = strategy_of(self.layout.strategy)
        return strategy.rank_batches(self.epoch_rows, Topology(rank, world_size), self.layout)

    @property
    def epoch_rows(self) -> int:
        """Rows an epoch reads across all ranks, before the remainder policy."""
        return self.plan.num_rows

    # --- the options, as the layout holds them ---------------------------------------------------

    @property
    def batch_size(self) -> int:
        """Rows per batch."""
        return self.layout.batch_size

    @property
    def shuffle(self) -> bool:
        """Whether chunks and rows inside blocks are shuffled."""
        return self.layout.shuffle

    @property
    def shuffle_seed(self) -> int:
        """The shuffle seed."""
        return self.layout.seed

    @property
    def drop_last(self) -> bool:
        """Whether each rank's last short batch is dropped."""
        return self.layout.drop_last

    @property
    def remainder(self) -> Remainder:
        """What happens to rows that do not divide among ranks."""
        return self.layout.remainder

    @property
    def split_strategy(self) -> SplitStrategy:
        """How streams divide the epoch."""
        return self.layout.strategy

    @property
    def block_rows(self) -> int:
        """Rows shuffled together."""
        return self.layout.block_rows

    @property
    def first_block_rows(self) -> int:
        """Rows of a stream's first block."""
        return self.layout.first_block_rows

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(format={self.format.name!r}, {_storage_repr(self.fs)}"
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


def _storage_repr(fs: FileSystemSpec) -> str:
    """The storage part of a dataset's repr: nothing for local files read as is; else the
    protocol, the storage options' keys (never their values: they may be secrets) and a
    backend other than ``"auto"``."""
    options: dict[str, Any] = {} if fs.refreshable else fs.storage_options
    if fs.is_local and not fs.refreshable and not options and fs.backend == "auto":
        return ""
    shown = (
        "<function>"
        if fs.refreshable
        else "{" + ", ".join(f"{k!r}: ..." for k in sorted(options)) + "}"
    )
    backend = "" if fs.backend == "auto" else f"storage_backend={fs.backend!r}, "
    return f"protocol={fs.protocol!r}, storage_options={shown}, {backend}"
