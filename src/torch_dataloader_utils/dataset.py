"""The IterableDataset: plans once in the main process, resolves its stream in each worker."""

from __future__ import annotations

import logging
import math
import numbers
import os
from collections.abc import Callable, Iterator, Mapping, Sequence
from itertools import islice
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import torch
from torch.utils.data import IterableDataset

from .batching import BatchOptions, Segment, cut_batches, shuffled_blocks
from .convert import Converter, Field, ListFormat, NullPolicy, OutputFormat
from .errors import ColumnNotFoundError, InvalidArgumentError, SchemaMismatchError
from .filters import filter_columns
from .formats import Format, ReadOptions, get_format
from .fs import FileSystemSpec, Source, SourceFile, hive_partitions, list_files
from .planning import (
    REMAINDER_POLICIES,
    SPLIT_STRATEGIES,
    Piece,
    Plan,
    Remainder,
    SplitStrategy,
    Topology,
    assign_stream,
    rank_span,
    resolve_rank,
)
from .prefetch import Prefetcher
from .reading import read_pieces, with_partition
from .transport import BUNDLE_BYTES, Bundle, bundle_rows, pack, packed_nbytes

if TYPE_CHECKING:
    from .loader import TabularDataLoader

__all__ = ["StructuredDataset"]

logger = logging.getLogger(__name__)

DEFAULT_SHUFFLE_BLOCK_BYTES = 64 * 2**20
# The first block of a stream is small so the first batch comes quickly; blocks then double.
_FIRST_BLOCK_ROWS = 16_384
# Rows read at plan time to measure the decoded size of a row.
_SAMPLE_ROWS = 1024
# When a filter does not apply to the first file, how many others to probe for schema drift.
_DRIFT_PROBE_FILES = 64


class StructuredDataset(IterableDataset[Any]):
    """Batches of structured data (Parquet, ...) read exactly once per epoch.

    The dataset plans in its constructor (main process): lists the files, reads footers, builds
    the `Plan`. Each time it is iterated it works out
    its own stream from the rank and the real DataLoader worker it runs in, so it never depends
    on the constructor knowing ``num_workers``. It yields whole batches: use it with
    ``DataLoader(batch_size=None)``, or better, `create_dataloader`.

    Args:
        path: a path or URL, a directory, a glob, a brace pattern, or a list of them.
        format: the format name (``"parquet"``) or a `Format`.
        batch_size: rows per batch.
        columns: columns to read (``None``: all). Partition columns may be named.
        filters: a ``pyarrow.compute.Expression``; prunes row groups at plan time and
            filters rows when reading.
        shuffle: shuffle chunk order per epoch and rows inside blocks.
        shuffle_seed: the seed; with ``set_epoch`` it fixes every epoch's order.
        split_bytes: target compressed bytes per chunk (``None``: one row group per chunk).
        split_rows: target rows per chunk.
        storage_options: options for the fsspec filesystem (credentials, endpoint).
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
        storage_options: Mapping[str, Any] | None = None,
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
    ) -> None:
        super().__init__()
        _check_positive(batch_size=batch_size, shuffle_block_bytes=shuffle_block_bytes)
        _check_positive(split_bytes=split_bytes, split_rows=split_rows)
        _check_positive(shuffle_block_size=shuffle_block_size)
        if shuffle_seed < 0:
            raise InvalidArgumentError(f"shuffle_seed must be >= 0, got {shuffle_seed}")
        if remainder not in REMAINDER_POLICIES:
            raise InvalidArgumentError(
                f"remainder must be one of {REMAINDER_POLICIES}, got {remainder!r}"
            )
        if split_strategy not in SPLIT_STRATEGIES:
            raise InvalidArgumentError(
                f"split_strategy must be one of {SPLIT_STRATEGIES}, got {split_strategy!r}"
            )
        if partitioning not in (None, "hive"):
            raise InvalidArgumentError(f'partitioning must be None or "hive", got {partitioning!r}')
        if isinstance(columns, str):
            raise InvalidArgumentError(
                f"columns must be a list of names, got the string {columns!r}"
            )
        self.format = get_format(format)
        first = os.fspath(path if isinstance(path, str | os.PathLike) else next(iter(path), ""))
        self.fs = FileSystemSpec.for_path(first, storage_options)
        self.batch_size = batch_size
        self.shuffle = shuffle
        self.shuffle_seed = shuffle_seed
        self.drop_last = drop_last
        self.remainder: Remainder = remainder
        self.split_strategy: SplitStrategy = split_strategy
        self.collate_fn = collate_fn
        self._rank = rank
        self._world_size = world_size
        if rank is not None or world_size is not None:
            resolve_rank(rank, world_size)  # validate now, before any worker starts
            Topology(rank or 0, world_size or 1)
        # The epoch lives in shared memory so set_epoch reaches persistent workers.
        self._epoch = torch.zeros(1, dtype=torch.int64).share_memory_()  # type: ignore[no-untyped-call]

        files = list_files(path, self.fs)
        if partitioning == "hive":
            partition_schema, partitions = hive_partitions(files)
        else:
            partition_schema, partitions = pa.schema([]), [() for _ in files]
        file_schema = self.format.schema(files[0], self.fs)
        clash = [k for k in partition_schema.names if k in file_schema.names]
        if clash:
            raise SchemaMismatchError(
                f"{self.fs.url(files[0].path)}: hive partition key(s) {clash} are also columns "
                'of the file; read without partitioning="hive" or rename one of them'
            )
        available = pa.schema(list(file_schema) + list(partition_schema))
        # Requested columns are checked against every file by the format's plan (missing
        # everywhere: ColumnNotFoundError; missing in some files: SchemaMismatchError).
        needed = self._filter_columns(filters, available, files, partition_schema)
        wanted = list(columns) if columns is not None else list(available.names)
        read = [c for c in dict.fromkeys([*wanted, *needed]) if c not in partition_schema.names]
        self.read_options = ReadOptions(
            columns=tuple(read) if columns is not None or needed else None,
            filter=filters,
            split_bytes=split_bytes,
            split_rows=split_rows,
            partition_schema=partition_schema,
        )
        planned = self.format.plan(files, partitions, self.fs, self.read_options)
        schema = pa.schema(list(planned.schema) + list(partition_schema))
        output = pa.schema([schema.field(c) for c in wanted])
        self.plan = Plan(
            chunks=tuple(planned.chunks),
            schema=output,
            row_bytes=planned.row_bytes,
            details=Plan.details_of(
                format=self.format.name, columns=wanted, filter=filters, hive=partitioning
            ),
        )
        self._output_columns = tuple(wanted) if needed or columns is not None else None
        self.converter = Converter(
            output,
            output_format=output_format,
            list_format=list_format,
            null_policy=null_policy,
            pad_value=pad_value,
        )
        row_bytes = max(self.plan.row_bytes, self._decoded_row_bytes())
        self.block_rows = shuffle_block_size or max(
            batch_size, int(shuffle_block_bytes // max(row_bytes, 1.0))
        )
        unequal = {
            "filters": filters is not None,
            'split_strategy="round_robin"': split_strategy == "round_robin",
        }
        reasons = [name for name, applies in unequal.items() if applies]
        if reasons and remainder != "uneven" and resolve_rank(rank, world_size)[1] > 1:
            raise InvalidArgumentError(
                f"{' and '.join(reasons)} with several ranks: ranks could get unequal batch "
                "counts (rows left after a row filter are not counted at plan time yet; "
                "round-robin deals whole chunks), which hangs DDP at the last collective. "
                'Pass remainder="uneven" to accept unequal ranks (and use join()), or filter '
                "the data beforehand"
            )
        logger.info("%s", self.plan.summary())

    def _decoded_row_bytes(self) -> float:
        """Decoded bytes per row, measured on the first rows of the first non-empty chunk.

        The footers' uncompressed sizes are encoded sizes: dictionary-encoded strings can be
        100x smaller there than in memory, which would make "64 MiB" blocks gigabytes.
        """
        chunk = next((c for c in self.plan.chunks if c.num_rows), None)
        if chunk is None:
            return 1.0
        batches = self.format.read(
            chunk, 0, min(chunk.num_rows, _SAMPLE_ROWS), self.fs, self.read_options
        )
        try:
            sample = [with_partition(b, chunk.partition, self.read_options) for b in batches]
        finally:
            self.format.close()
        nbytes = sum(int(b.nbytes) for b in sample)
        rows = sum(int(b.num_rows) for b in sample)
        return float(nbytes / max(1, rows))

    def _filter_columns(
        self,
        filters: Any,
        available: pa.Schema,
        files: Sequence[SourceFile],
        partition_schema: pa.Schema,
    ) -> tuple[str, ...]:
        try:
            return filter_columns(filters, available)
        except ColumnNotFoundError as exc:
            # The first file lacks a column: say so if another file has it (schema drift).
            for other in files[1:_DRIFT_PROBE_FILES]:
                schema = pa.schema(
                    list(self.format.schema(other, self.fs)) + list(partition_schema)
                )
                try:
                    filter_columns(filters, schema)
                except ColumnNotFoundError:
                    continue
                raise SchemaMismatchError(
                    f"{self.fs.url(files[0].path)} and {self.fs.url(other.path)} disagree on the "
                    f"columns that filters {filters} reads: it applies to the second only"
                ) from exc
            raise ColumnNotFoundError(f"{self.fs.url(files[0].path)}: {exc}") from exc

    # --- epochs ---------------------------------------------------------------------------------

    def set_epoch(self, epoch: int) -> None:
        """Set the epoch: with ``shuffle=True`` each epoch has its own order.

        Call it before iterating the loader each epoch; it reaches persistent workers.
        """
        if epoch < 0:
            raise InvalidArgumentError(f"epoch must be >= 0, got {epoch}")
        self._epoch[0] = epoch

    @property
    def epoch(self) -> int:
        """The current epoch."""
        return int(self._epoch[0])

    # --- the stream of one worker ---------------------------------------------------------------

    def topology(self) -> Topology:
        """The topology of the calling process (rank, and the DataLoader worker it runs in)."""
        rank, world_size = resolve_rank(self._rank, self._world_size)
        return Topology(rank, world_size).with_worker()

    def pieces(self, topology: Topology, epoch: int) -> list[Piece]:
        """The pieces ``topology``'s stream reads in ``epoch``."""
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

    def segments(self, topology: Topology, epoch: int) -> Iterator[Segment]:
        """The batches of ``topology``'s stream in ``epoch`` before conversion, each a record
        batch and the indices of its rows in output order (``None``: all, in order)."""
        pieces = self.pieces(topology, epoch)
        length = sum(p.num_rows for p in pieces)
        options = BatchOptions(
            batch_size=self.batch_size,
            shuffle=self.shuffle,
            block_rows=self.block_rows,
            first_block_rows=min(self.block_rows, max(self.batch_size, _FIRST_BLOCK_ROWS)),
            seed=self.shuffle_seed,
            filter=self.read_options.filter,
            output_columns=self._output_columns,
        )
        rows = read_pieces(
            pieces,
            self.plan.chunks,
            self.format,
            self.fs,
            self.read_options,
            rejects_nulls=self.converter.rejects_nulls,
        )
        blocks = shuffled_blocks(rows, length, options, epoch=epoch, stream=topology.stream)
        # The thread reads, filters and assembles whole blocks while this one gathers, converts
        # and packs the previous block. A queue of read batches instead let the reader get only
        # a little ahead of a block, and the two alternated (measured: ~25% of a worker idle).
        # Memory: the block being gathered, one ready, one being assembled.
        ahead = Prefetcher(blocks, depth=1 if self.shuffle else 4)
        # Streams are batch-aligned, so drop_last already left only whole batches, except
        # where rows are not known at plan time (a row filter) or streams are whole chunks.
        unaligned = self.read_options.filter is not None or self.split_strategy != "equal"
        yield from cut_batches(ahead, self.batch_size, drop_short=self.drop_last and unaligned)

    def __iter__(self) -> Iterator[Any]:
        topology = self.topology()
        batches = self.segments(topology, self.epoch)
        convert = self.converter
        collate = self.collate_fn
        per_bundle = math.ceil(bundle_rows() / self.batch_size) if bundle_rows() else 0
        if not per_bundle:
            outputs = (convert(b, rows) for b, rows in batches)
            yield from outputs if collate is None else (collate(o) for o in outputs)
            return
        # In a TabularDataLoader worker: several batches per message. Bundles ramp up 1, 2, 4 ...
        # batches so the first batch leaves the worker as soon as it is ready.
        size = 1
        if collate is None and convert.output_format == "torch":
            # All numeric data of a bundle in one shared buffer: one segment per message, of
            # at most `bundle_rows` rows and about BUNDLE_BYTES (wide rows: fewer rows).
            group: list[list[Field]] = []
            nbytes = 0
            for batch, rows in batches:
                group.append(convert.fields(batch, rows))
                nbytes += packed_nbytes(group[-1])
                if len(group) >= size or nbytes >= BUNDLE_BYTES:
                    yield pack(group)
                    group, nbytes, size = [], 0, min(size * 2, per_bundle)
            if group:
                yield pack(group)
            return
        outputs = (convert(b, rows) for b, rows in batches)
        if collate is not None:
            outputs = (collate(o) for o in outputs)
        while items := list(islice(outputs, size)):
            yield Bundle(items)
            size = min(size * 2, per_bundle)

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        if state["_rank"] is None:
            # Pickled for a spawn/forkserver worker: it will not have this process's
            # torch.distributed group, so it takes the rank resolved here (as a fork would).
            state["_rank"], state["_world_size"] = resolve_rank(None, None)
        return state

    def __len__(self) -> int:
        """Batches this rank yields per epoch (whatever the number of workers).

        Raises:
            TypeError: the count is unknown until the data is read (a row filter), or depends
                on the number of workers (``split_strategy="round_robin"``).
        """
        if self.read_options.filter is not None:
            raise TypeError("the number of batches is unknown with a row filter")
        if self.split_strategy != "equal":
            raise TypeError('the number of batches depends on the workers with "round_robin"')
        rank, world_size = resolve_rank(self._rank, self._world_size)
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


def _check_positive(**values: object) -> None:
    for name, value in values.items():
        if value is not None and (
            isinstance(value, bool) or not isinstance(value, numbers.Integral) or value <= 0
        ):
            raise InvalidArgumentError(f"{name} must be a positive integer, got {value!r}")
