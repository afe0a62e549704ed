"""`StructuredDataset`: files read as one dataset, with the earlier library's arguments."""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar

from ..batching import Packing, TokenBudget
from ..convert import ListFormat, NullPolicy, Output, OutputFormat
from ..errors.on_error import OnError
from ..formats import Format, ReadOptions
from ..fs import FileSystemSpec, Paths, RetryPolicy, StorageBackend, StorageOptions
from ..loader import TabularDataLoader
from ..options import LOADER_KEYWORDS, LoaderOptions, Options, Source, ranks_of
from ..planning import Remainder, SplitStrategy
from ..stream.blocks import DEFAULT_SHUFFLE_BLOCK_BYTES
from ..tokenizing import Tokenize, Transform
from .base import PlannedDataset

__all__ = ["StructuredDataset", "loader_over"]

_Dataset = TypeVar("_Dataset", bound=PlannedDataset)


class StructuredDataset(PlannedDataset):
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
            on the machine, so later epochs and restarts read it from disk (docs/how-to/cache.md).
            Default: ``$TDU_CACHE_DIR``, else no cache; ``""`` turns it off. Local files' bytes
            are never cached. Each source's plan is kept there too (local files included), so
            a restart whose listing is unchanged reads no footer (docs/concepts/scale.md).
        cache_limit: bytes the cache may hold: an int or ``"50GB"``, ``"512MiB"`` (default:
            ``$TDU_CACHE_LIMIT``, else what the disk holds while a tenth of it stays free).
        packing: a `Packing`: the documents of a token-list column concatenated and cut into
            sequences of ``seq_len`` tokens, every token once per epoch; batches of
            ``batch_size`` sequences hold ``input_ids``, ``position_ids``, ``document_ids``,
            ``cu_seqlens`` and ``max_seqlen`` (docs/adr/0022-packed-sequences.md).
        batching: a `TokenBudget`: batches of whole rows whose padded size (rows x longest
            row of its column) is at most ``max_tokens``, instead of ``batch_size`` rows; every
            rank still gets the same number of batches (docs/adr/0022-packed-sequences.md).
        tokenize: a `Tokenize`: a text column tokenized in the loader into a token column
            (``Tokenize.output``) that ``packing`` or ``batching`` takes; each chunk's tokens
            are counted once before epoch 0 by the census (docs/concepts/census.md).
        transform: a `Transform`: a function over each record batch of a chunk's rows (it may
            drop rows), run before tokenizing; the census counts the rows it yields.
        census_dir: a folder (local or object storage) where the census's counts are kept
            for every job and node to reuse, besides ``cache_dir``.
        version: a table read by path (``format="delta"`` or ``"lance"``): the version to
            read (default: the latest at planning, pinned in the plan and the state).
        as_of: such a table's version current at this time (a ``datetime``, an ISO 8601
            string, epoch milliseconds).

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
        batching: TokenBudget | None = None,
        tokenize: Tokenize | None = None,
        transform: Transform | None = None,
        census_dir: str | os.PathLike[str] | None = None,
        version: int | str | None = None,
        as_of: Any = None,
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
            census_dir=census_dir,
            output=Output(output_format, list_format, null_policy, pad_value),
            packing=packing,
            batching=batching,
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
            tokenize=tokenize,
            transform=transform,
            version=version,
            as_of=as_of,
        )
        self._build((source,), options)

    # --- what its one source has -----------------------------------------------------------------

    @property
    def format(self) -> Format:
        """The format the source is read with."""
        return self.sources[0].format

    @property
    def fs(self) -> FileSystemSpec:
        """The filesystem the source is on."""
        return self.sources[0].fs

    @property
    def read_options(self) -> ReadOptions:
        """What the source's reads read (columns, filter, what planning learned)."""
        return self.sources[0].read_options

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
    options checked first, before anything is planned; the dataset's keywords by the
    dataset)."""
    given = dict(kwargs)
    loading = LoaderOptions(**{k: given.pop(k) for k in LOADER_KEYWORDS if k in given})
    return loading.loader(cls(data, format, **given))
