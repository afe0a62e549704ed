"""The IterableDataset: plans its sources once, resolves its stream in each worker.

One body serves every dataset: a tuple of planned sources (one for files or a table, several
for a mixture) and the `Streams` that cut its epochs. The constructors differ only in how they
plan and combine their sources (`StructuredDataset`, `IcebergDataset`, `MixtureDataset`).
"""

from __future__ import annotations

import dataclasses
import functools
import json
import logging
import os
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import pyarrow as pa
from torch.utils.data import IterableDataset, get_worker_info

from .cache import CacheConfig, CacheCounter, CacheStats, CachingFileSystem, open_store
from .convert import Converter, Decoding, ListFormat, NullPolicy, Output, OutputFormat
from .errors import InvalidArgumentError, UnsupportedTypeError
from .errors.keywords import check_init_keywords
from .errors.on_error import FailureLog, OnError
from .formats import Format, ReadOptions, get_format
from .fs import FileSystemSpec, Paths, RetryPolicy, StorageBackend, StorageOptions
from .loader import TabularDataLoader
from .options import LOADER_KEYWORDS, LoaderOptions, Options, Packing, Source, ranks_of
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
from .planning.streams import OneSource, Stream, Streams
from .sources.files import Planned, plan_source
from .sources.planned import PlannedSource, plan_sources, planned_source
from .state import Passes, Progress
from .stream.blocks import DEFAULT_SHUFFLE_BLOCK_BYTES, Segment
from .stream.packing import PackedCollate, TokenReader
from .stream.pipeline import stream_segments
from .stream.read import Reader, Reads
from .transport import bundle_rows, worker_messages

__all__ = ["Combined", "StructuredDataset", "loader_over"]

logger = logging.getLogger(__name__)

_Dataset = TypeVar("_Dataset", bound="StructuredDataset")


@dataclass(frozen=True)
class Combined:
    """A dataset's planned sources as one: the plan the state names, decoded bytes per row
    (block sizes), and how a layout cuts the epochs into streams."""

    plan: Plan
    row_bytes: float
    streams: Callable[[Layout], Streams]


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
        packing: a `Packing`: the documents of a token-list column concatenated and cut into
            sequences of ``seq_len`` tokens, every token once per epoch; batches of
            ``batch_size`` sequences hold ``input_ids``, ``position_ids``, ``document_ids``,
            ``cu_seqlens`` and ``max_seqlen`` (docs/adr/0022-packed-sequences.md).

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
        check_init_keywords(cls, kwargs)
        return super().__new__(cls)

    def __init__(
        self,
        path: Paths,
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
        packing: Packing | None = None,
    ) -> None:
        # The public keywords become the two option values here, once.
        options = Options(
            batch_size=batch_size,
            shuffle=shuffle,
            shuffle_seed=shuffle_seed,
            drop_last=drop_last,
            shuffle_block_size=shuffle_block_size,
            shuffle_block_bytes=shuffle_block_bytes,
            rank=rank,
            world_size=ranks_of(world_size, num_ranks),
            remainder=remainder,
            split_strategy=split_strategy,
            on_error=on_error,
            collate_fn=collate_fn,
            cache_dir=cache_dir,
            cache_limit=cache_limit,
            output=Output(output_format, list_format, null_policy, pad_value),
            packing=packing,
        )
        source = Source(
            path=path,
            format=format,
            columns=columns,
            filters=filters,
            storage_options=storage_options,
            format_options=format_options,
            partitioning=partitioning,
            split_bytes=split_bytes,
            split_rows=split_rows,
            storage_backend=storage_backend,
            retries=retries,
        )
        self._build((source,), options)

    # --- the one body: plan the sources, combine them, cut the epochs ---------------------------

    def _build(self, sources: Sequence[Source], options: Options) -> None:
        """Plan ``sources`` in one planning step and set up the dataset over them."""
        IterableDataset.__init__(self)
        self.options = options
        self.collate_fn = options.collate_fn
        self.on_error: OnError = options.on_error
        self._failures: FailureLog | None = None  # this process's, made when first used
        self._ranks = Ranks(options.rank, options.world_size)  # validates an explicit rank now
        self._reading: Progress | None = None  # the pass this process reads
        self.cache: CacheConfig | None = CacheConfig.of(options.cache_dir, options.cache_limit)
        self._cache_counter = CacheCounter() if self.cache is not None else None
        if self.cache is not None:
            open_store(self.cache)  # a directory that cannot be made fails here, named
        formats = [self._format(s) for s in sources]
        filesystems = [
            FileSystemSpec.for_path(
                s.first_path,
                s.storage_options,
                backend=s.storage_backend,
                retry=RetryPolicy.of(s.retries),
            )
            for s in sources
        ]
        # Listing, footers and row counting happen once: on rank 0 when torch.distributed is
        # up (the others receive the result), else here.
        planned = plan_sources(
            len(sources),
            lambda i: self._plan(sources[i], formats[i], filesystems[i]),
            explicit=options.rank is not None,
        )
        self.sources: tuple[PlannedSource, ...] = tuple(
            planned_source(s.label, p, f, fs, immutable=s.table is not None)
            for s, p, f, fs in zip(sources, planned, formats, filesystems, strict=True)
        )
        combined = self._combine(self.sources)
        if options.packing is not None:
            combined = self._packed(combined, options.packing)
        self.plan: Plan = combined.plan
        self.layout = options.layout(
            row_bytes=combined.row_bytes,
            chunk_rows=self.plan.num_rows / max(len(self.plan.chunks), 1),
        )
        strategy_of(self.layout.strategy).check(self.layout, self._ranks)
        self.streams = combined.streams(self.layout)
        # The epoch and passes, shared with this rank's DataLoader workers (persistent ones
        # too) and with the loader: see `Passes`.
        self.passes = Passes(self.plan, self.streams, self._ranks)
        self._convert(options.output)
        logger.info("%s", self.plan.summary())

    def _convert(self, output: Output) -> None:
        """The converter, each source's checks and the decoders of the sources' formats."""
        decoders: dict[str, Any] = {}
        if output.format != "arrow":
            for source in self.sources:
                for name, decoder in source.format.decoders(source.plan.schema).items():
                    decoders.setdefault(name, decoder)
        # Read with the columns that name a sample (every source has them), so that a value
        # that does not decode is named by its file and sample whatever the columns asked
        # for; dropped after decoding.
        schema = self.plan.schema
        carried = [
            c
            for c in self.sources[0].format.sample_columns
            if decoders
            and c not in schema.names
            and all(c in s.format.sample_columns for s in self.sources)
        ]
        self._carried = tuple(carried)
        strings = [pa.field(c, pa.string()) for c in carried]
        self._checks = tuple(
            _converter(output, pa.schema([*s.plan.schema, *strings]), s.label).check
            for s in self.sources
        )
        whole = self.sources[0].label if len(self.sources) == 1 else "a mixture of sources"
        self.converter: Converter = _converter(output, pa.schema([*schema, *strings]), whole)
        self._collate = (
            Decoding(
                decoders,
                output_format=output.format,
                collate=self.collate_fn,
                on_error=self.on_error,
                carried=self._carried,
            )
            if decoders
            else self.collate_fn
        )
        packing = self.options.packing
        if packing is not None:
            self._collate = PackedCollate(packing.seq_len, packing.pad_value, self._collate)

    def _packed(self, combined: Combined, packing: Packing) -> Combined:
        """The plan of a packed dataset: its order is one of tokens (docs/adr/0022), each
        chunk's tokens counted at planning; a token is a row of ``input_ids`` (the token),
        ``document`` and ``position`` (`stream.packing.explode`)."""
        if len(self.sources) != 1:
            raise InvalidArgumentError("packing a mixture is not built yet")
        (only,) = self.sources
        kind = only.plan.schema.field(packing.column).type  # (checked by planning)
        assert only.chunk_tokens is not None, "a packed dataset's planning counts tokens"
        token = pa.schema(
            [
                pa.field("input_ids", kind.value_type, nullable=False),
                pa.field("document", pa.int64(), nullable=False),
                pa.field("position", pa.int32(), nullable=False),
            ]
        )
        identity = {
            "column": packing.column,
            "seq_len": packing.seq_len,
            "method": packing.method,
            "eos_token": packing.eos_token,
        }
        plan = Plan(
            chunks=only.plan.chunks,
            schema=token,
            row_bytes=kind.value_type.bit_width / 8 + 12,
            details=(*only.plan.details, *Plan.details_of(packing=json.dumps(identity))),
            filtered_rows=only.chunk_tokens,
            files=only.plan.files,
        )
        return Combined(plan, plan.row_bytes, functools.partial(OneSource, plan))

    def _format(self, source: Source) -> Format:
        """The format ``source`` is read with (on every rank)."""
        return get_format(source.format, source.format_options)

    def _plan(self, source: Source, fmt: Format, fs: FileSystemSpec) -> Planned:
        """Plan ``source``: list, read footers, count filtered rows (on rank 0 only)."""
        if source.table is not None:
            raise InvalidArgumentError(
                f"{type(self).__name__} reads files; read the table {source.label!r} with "
                "IcebergDataset, or as a tdu.Source of a mixture"
            )
        assert source.path is not None
        return plan_source(
            source.path,
            fmt,
            fs,
            columns=source.columns,
            filters=source.filters,
            partitioning=source.partitioning,
            split_bytes=source.split_bytes,
            split_rows=source.split_rows,
            cached=self._cached if self.cache is not None else None,
            tokens=self.options.packing.column if self.options.packing is not None else None,
            eos=self.options.packing is not None and self.options.packing.eos_token is not None,
        )

    def _combine(self, sources: tuple[PlannedSource, ...]) -> Combined:
        """The planned sources as one (a mixture's differ): here, the only one."""
        (only,) = sources
        return Combined(only.plan, only.row_bytes, functools.partial(OneSource, only.plan))

    # --- what one source has (a mixture's sources each have their own) --------------------------

    def _only(self, what: str) -> PlannedSource:
        if len(self.sources) != 1:
            raise AttributeError(
                f"a dataset of {len(self.sources)} sources has no single {what}: see "
                f"dataset.sources[i].{what}"
            )
        return self.sources[0]

    @property
    def format(self) -> Format:
        """The format the source is read with."""
        return self._only("format").format

    @property
    def fs(self) -> FileSystemSpec:
        """The filesystem the source is on."""
        return self._only("fs").fs

    @property
    def read_options(self) -> ReadOptions:
        """What the source's reads read (columns, filter, what planning learned)."""
        return self._only("read_options").read_options

    # --- the node-local cache ------------------------------------------------------------------

    def _cached(
        self,
        fs: FileSystemSpec,
        files: Mapping[str, tuple[int, str]],
        *,
        trusted: bool = False,
        immutable: bool = False,
    ) -> FileSystemSpec:
        """``fs`` with its reads of ``files`` through the cache (remote storage only)."""
        if self.cache is None or fs.is_local:
            return fs
        assert self._cache_counter is not None
        return CachingFileSystem(
            fs, self.cache, self._cache_counter, files, immutable=immutable, trusted=trusted
        )

    @property
    def cache_stats(self) -> CacheStats | None:
        """What the node-local cache did for this dataset so far (every process, planning
        included); None without a cache."""
        return None if self._cache_counter is None else self._cache_counter.snapshot()

    @property
    def storage_retries(self) -> int:
        """Storage requests retried so far, in this process and its DataLoader workers, over
        every source (each retry is also logged at WARNING on the
        ``torch_dataloader_utils.storage`` logger)."""
        return sum(s.fs.retries.total for s in self.sources)

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
        """The pieces ``topology``'s stream reads in a fresh pass over ``epoch`` (a mixture's:
        each source's in turn, numbered as the chunks of `plan`)."""
        stream = self.streams.resolve(Iteration(epoch), topology, done=0)
        offsets = [0]
        for source in self.sources[:-1]:
            offsets.append(offsets[-1] + len(source.plan.chunks))
        return [
            p._replace(chunk=p.chunk + offsets[rows.source or 0])
            for rows in stream.sources
            for p in rows.pieces()
        ]

    def reader(
        self, failures: FailureLog | None = None, *, carry: bool = False, source: int = 0
    ) -> Reads:
        """A reader of source ``source``'s plan; its skipped reads go to ``failures`` (default:
        this process's `failure_log`). ``carry``: its batches also hold the columns that name
        a sample (`Format.sample_columns`) for this dataset's decoding to name bad values."""
        planned = self.sources[source]
        options, output = planned.read_options, planned.output_columns
        if carry and self._carried and options.columns is not None and output is not None:
            options = dataclasses.replace(options, columns=(*options.columns, *self._carried))
            output = (*output, *self._carried)
        reader = Reader(
            planned.plan.chunks,
            planned.format,
            self._cached(planned.fs, planned.plan.files, immutable=planned.immutable),
            options,
            output_columns=output,
            check=self._checks[source],
            files=planned.plan.files,
            on_error=self.on_error,
            failures=self.failure_log if failures is None else failures,
            row_bytes=planned.plan.row_bytes,
        )
        packing = self.options.packing
        if packing is None:
            return reader
        return TokenReader(reader, packing.column, planned.plan.chunk_rows, packing.eos_token)

    def _segments(self, stream: Stream) -> Iterator[Segment]:
        """The batches of ``stream`` before conversion, from where its pass starts."""
        readers = [self.reader(carry=True, source=i) for i in range(len(self.sources))]
        return stream_segments(stream, readers, **self._mixing())

    def _mixing(self) -> dict[str, Any]:
        """What `stream_segments` needs to interleave several sources (none: one source)."""
        return {}

    def __iter__(self) -> Iterator[Any]:
        # Not a generator: the pass (its epoch, its start) is fixed when iter() is called, as
        # torchdata's StatefulDataLoader asks a worker's state right after iter(dataset).
        topology = self.topology()
        iteration, done = self.passes.this_pass(topology)
        stream = self.streams.resolve(iteration, topology, done=done)
        reading = Progress(iteration, stream.done, stream.batches, topology)
        self._reading = reading
        return self._read(stream, reading)

    def _read(self, stream: Stream, reading: Progress) -> Iterator[Any]:
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
        return self.streams.rank_batches(Topology(rank, world_size))

    @property
    def epoch_rows(self) -> int:
        """Rows an epoch reads across all ranks, before the remainder policy."""
        return self.streams.epoch_rows

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
            f"{type(self).__name__}(format={self.format.name!r}, {self.fs.described()}"
            f"chunks={len(self.plan.chunks)}, rows={self.plan.num_rows}, "
            f"batch_size={self.batch_size}, shuffle={self.shuffle})"
        )

    @classmethod
    def create_dataloader(
        cls, path: Paths, format: str | Format = "parquet", **kwargs: Any
    ) -> tuple[TabularDataLoader[StructuredDataset], StructuredDataset]:
        """Build the dataset and a DataLoader over it; see `create_dataloader`.

        Returns:
            ``(loader, dataset)``: call ``dataset.set_epoch(epoch)`` before each epoch.
        """
        loader = loader_over(cls, path, format, kwargs)
        return loader, loader.dataset


def loader_over(
    cls: type[_Dataset], data: Any, format: Any, kwargs: Mapping[str, Any]
) -> TabularDataLoader[_Dataset]:
    """``cls(data, format, **dataset keywords)`` and a `TabularDataLoader` over it (the loader's
    options checked first, before anything is planned)."""
    given = dict(kwargs)
    loading = LoaderOptions(**{k: given.pop(k) for k in LOADER_KEYWORDS if k in given})
    check_init_keywords(cls, given, also=LOADER_KEYWORDS)
    return loading.loader(cls(data, format, **given))


def _converter(output: Output, schema: pa.Schema, label: str) -> Converter:
    try:
        return output.converter(schema)
    except UnsupportedTypeError as exc:  # at planning: name the source
        raise UnsupportedTypeError(f"{label}: {exc}") from None
