"""The one dataset body (`PlannedDataset`): plans its sources once, cuts the epochs into
streams, and in each process reads the stream of the pass it is in."""

from __future__ import annotations

import dataclasses
import functools
import logging
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
from torch.utils.data import IterableDataset, get_worker_info

from ..cache import CacheConfig, CacheCounter, CacheStats, ReadCache, open_store
from ..convert import Decoding, Output
from ..errors import InvalidArgumentError
from ..errors.on_error import FailureLog, OnError
from ..fs import FileSystemSpec, RetryPolicy
from ..metrics.clock import MAKE, READ, StageClock
from ..options import Options, Source
from ..planning import (
    Layout,
    Pass,
    Piece,
    Plan,
    Ranks,
    Remainder,
    SplitStrategy,
    Topology,
    strategy_of,
)
from ..planning.budget import group_rows, mean_batch_rows
from ..planning.streams import OneSource, Stream, Streams
from ..sources.planned import PlannedSource, plan_sources, planned_source
from ..state import Passes, Progress
from ..stream.balanced import balanced_segments
from ..stream.blocks import Segment
from ..stream.pipeline import stream_segments
from ..stream.read import Reads
from ..transport import bundle_rows, worker_messages
from ..transport.worker import Converts
from .balancing import balanced, with_balance
from .chunk_rows import ChunkRows
from .collection import paused_collection
from .conversion import conversion
from .keywords import check_dataset_keywords
from .lookup import Lookup
from .planning import format_of, plan
from .reading import source_reader
from .tables import table_kind_of
from .tokens import in_tokens, length_index

__all__ = ["Combined", "PlannedDataset"]

logger = logging.getLogger(__package__)


@dataclass(frozen=True)
class Combined:
    """A dataset's planned sources as one: the plan the state names, decoded bytes per row
    (block sizes), and how a layout cuts the epochs into streams."""

    plan: Plan
    row_bytes: float
    streams: Callable[[Layout], Streams]


class PlannedDataset(IterableDataset[Any]):
    """What every dataset is: planned sources, the `Streams` that cut its epochs, the passes
    its loader and workers share, and the reading of one process's stream.

    A constructor (`StructuredDataset`, `IcebergDataset`, `MixtureDataset`) turns its
    arguments into `Source` and `Options` values and calls `_build`, which plans each source
    as its kind is planned (`dataset.planning`); a mixture also says how its planned sources
    combine (`_combine`). The keywords a constructor takes are those of its kind of sources
    (``_reads``), checked before it runs (`dataset.keywords`).
    """

    _lookup: Lookup | None = None  # `rows_at`'s, made when first used
    _reads = "files"  # the keywords the constructor takes: a source of files, a table, a mixture

    def __new__(cls, *args: Any, **kwargs: Any) -> PlannedDataset:
        # Before __init__ binds them: Python's own error would name no valid keyword.
        check_dataset_keywords(cls, cls._reads, kwargs)
        return super().__new__(cls)

    # --- the one body: plan the sources, combine them, cut the epochs ---------------------------

    @paused_collection()
    def _build(self, sources: Sequence[Source], options: Options) -> None:
        """Plan ``sources`` in one planning step and set up the dataset over them."""
        IterableDataset.__init__(self)
        started = time.perf_counter()
        # Where each process's time goes (metrics.clock): shared with the workers.
        self.clock = StageClock()
        if options.packing is not None:  # (before planning: what a packed batch cannot carry)
            for source in sources:
                label = source.label if len(sources) > 1 else ""
                if source.transform is not None:
                    continue  # (its columns are what the transform reads)
                text = source.tokenize.column if source.tokenize is not None else None
                columns = source.columns
                if columns is not None and text is not None:
                    columns = [c for c in columns if c != text] or None
                options.packing.check_columns(columns, source_column=self._source_key, label=label)
        self.options = options
        self.collate_fn = options.collate_fn
        self.on_error: OnError = options.on_error
        self._failures: FailureLog | None = None  # this process's, made when first used
        self._ranks = Ranks(options.rank, options.world_size)  # validates an explicit rank now
        self._reading: Progress | None = None  # the pass this process reads
        config = CacheConfig.of(options.cache_dir, options.cache_limit)
        if config is not None:
            open_store(config)  # a directory that cannot be made fails here, named
        # The node-local cache planning and every reader read through (none: storage as it is).
        self.cache: ReadCache | None = None if config is None else ReadCache(config, CacheCounter())
        formats = [format_of(s) for s in sources]
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
            lambda i, spread: plan(
                sources[i],
                formats[i],
                filesystems[i],
                spread,
                options=options,
                cache=self.cache,
            ),
            explicit=options.rank is not None,
        )
        self.sources: tuple[PlannedSource, ...] = tuple(
            planned_source(
                s.label, p, f, fs, immutable=table_kind_of(s) is not None, derive=s.derive
            )
            for s, p, f, fs in zip(sources, planned, formats, filesystems, strict=True)
        )
        packing = options.packing
        # A packed dataset's order is one of tokens: its sources combine as token plans (they
        # are read by their own plans of rows).
        combined = self._combine(
            self.sources if packing is None else tuple(in_tokens(s, packing) for s in self.sources)
        )
        self.plan: Plan = with_balance(combined.plan, options)
        budget = options.batching
        lengths = None if budget is None else length_index(self.sources, self.plan, budget)
        group = None if lengths is None else group_rows(lengths)
        self.layout = options.layout(
            row_bytes=combined.row_bytes,
            chunk_rows=self.plan.num_rows / max(len(self.plan.chunks), 1),
            group=group,
        )
        # Rows a batch delivers, about (a packed batch's: its sequences; a budget's: its
        # budget over the mean row): a worker's messages are sized by it.
        self.rows_out = options.batch_size if group is None else mean_batch_rows(group)
        strategy_of(self.layout.strategy).check(self.layout, self._ranks)
        self.streams: Streams = combined.streams(self.layout)
        if budget is not None and lengths is not None:
            truncate = budget.overflow == "truncate"
            self.streams = self.streams.budgeted(lengths, budget.column, truncate)
        self.streams = balanced(self.streams, self.sources, options, lengths)
        # The epoch and passes, shared with this rank's DataLoader workers (persistent ones
        # too) and with the loader: see `Passes`.
        self.passes = Passes(self.plan, self.streams, self._ranks)
        self._convert(options.output)
        self.planning_s = time.perf_counter() - started  # listing, footers, counting
        logger.info("%s", self.plan.summary())

    def _convert(self, output: Output) -> None:
        """The converter, each source's checks and the decoders of the sources' formats."""
        made = conversion(
            self.sources, self.plan.schema, output, self.options, self.collate_fn, self._source_key
        )
        self.converter: Converts = made.converter
        self._checks, self._collate, self._carried = made.checks, made.collate, made.carried

    def _combine(self, sources: tuple[PlannedSource, ...]) -> Combined:
        """The planned sources as one (a mixture's differ): here, the only one."""
        (only,) = sources
        return Combined(only.plan, only.row_bytes, functools.partial(OneSource, only.plan))

    # --- the node-local cache ------------------------------------------------------------------

    @property
    def cache_stats(self) -> CacheStats | None:
        """What the node-local cache did for this dataset so far (every process, planning
        included); None without a cache."""
        return None if self.cache is None else self.cache.counter.snapshot()

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
        stream = self.streams.resolve(Pass(epoch), topology, done=0)
        offsets = [0]
        for source in self.sources[:-1]:
            offsets.append(offsets[-1] + len(source.plan.chunks))
        return [
            p._replace(chunk=p.chunk + offsets[rows.index or 0])
            for rows in stream.sources
            for p in rows.pieces()
        ]

    def reader(
        self, failures: FailureLog | None = None, *, carry: bool = False, source: int = 0
    ) -> Reads:
        """A reader of source ``source``'s plan; its skipped reads go to ``failures`` (default:
        this process's `failure_log`). ``carry``: its batches also hold the columns that name
        a sample (`Format.sample_columns`) for this dataset's decoding to name bad values."""
        return source_reader(
            self.sources[source],
            packing=self.options.packing,
            cache=self.cache,
            check=self._checks[source],
            on_error=self.on_error,
            failures=self.failure_log if failures is None else failures,
            carried=self._carried if carry else (),
            mixed=source if len(self.sources) > 1 else None,
        )

    def _segments(self, stream: Stream) -> Iterator[Segment]:
        """The batches of ``stream`` before conversion, from where its pass starts."""
        if stream.balanced is not None:  # other streams' batches (planning.balanced)
            return balanced_segments(stream.balanced, self._segments)
        readers = [self.reader(carry=True, source=i) for i in range(len(self.sources))]
        return stream_segments(stream, readers, **self._mixing())

    @property
    def _source_key(self) -> str | None:
        """The output key of each row's source (a mixture's ``source_column``)."""
        return None

    def _mixing(self) -> dict[str, Any]:
        """What `stream_segments` needs to interleave several sources (none: one source)."""
        return {}

    def __iter__(self) -> Iterator[Any]:
        # Not a generator: the pass (its epoch, its start) is fixed when iter() is called, as
        # torchdata's StatefulDataLoader asks a worker's state right after iter(dataset).
        topology = self.topology()
        pass_, done = self.passes.this_pass(topology)
        stream = self.streams.resolve(pass_, topology, done=done)
        reading = Progress(pass_, stream.done, stream.batches, topology)
        self._reading = reading
        return self._read(stream, reading)

    def _read(self, stream: Stream, reading: Progress) -> Iterator[Any]:
        in_main = get_worker_info() is None
        if not in_main:
            self.failure_log.relayed = bundle_rows() > 0  # a TabularDataLoader's worker
        collate = self._collate
        if isinstance(collate, Decoding) and self.on_error == "skip":
            collate = dataclasses.replace(collate, failures=self.failure_log)
        # (A segment is a batch's rows; the time making each from them is `make`'s.)
        segments = self.clock.timed(self._segments(stream), READ, counts=True)
        messages = worker_messages(
            segments,
            self.converter,
            collate,
            worker=stream.topology.worker,
            batch_size=self.rows_out,
            failures=None if in_main else self.failure_log,
        )
        messages = self.clock.timed_less(messages, MAKE, (READ,))
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
        state["_lookup"] = None  # (what lookups keep: the main process's)
        return state

    def __len__(self) -> int:
        """Batches this rank yields per epoch (whatever the number of workers).

        Raises:
            TypeError: the count depends on the number of workers
                (``split_strategy="round_robin"``).
        """
        return self.passes.rank_batches(self.passes.epoch, num_workers=self.passes.num_workers)

    def rows_at(
        self,
        batch: int,
        epoch: int | None = None,
        rank: int | None = None,
        *,
        num_workers: int = 1,
        columns: Sequence[str] | None = None,
    ) -> pa.Table:
        """`TabularDataLoader.rows_at` (``num_workers``: the loader's DataLoader workers).

        Raises:
            InvalidArgumentError: no such batch or rank.
            ColumnNotFoundError: a column asked for is not in the data.
        """
        mine, world_size = self.resolved_rank()
        if self._lookup is None:  # (made once: it keeps what lookups share)
            rows = ChunkRows(self.sources, self.cache)
            self._lookup = Lookup(self.streams, rows, self.options.packing)
        pass_ = self.passes.numbered(self.passes.epoch if epoch is None else epoch)
        ranks = (mine if rank is None else rank, world_size, max(1, num_workers))
        return self._lookup.rows_at(batch, pass_=pass_, ranks=ranks, columns=columns)

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
