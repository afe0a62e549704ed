"""The options a loader is built from: one `Source` per source, the dataset's `Options`, and
the DataLoader's (`LoaderOptions`).

The public keyword arguments (`create_dataloader`'s, the dataset classes', the earlier
library's) are turned into these values once, at the edge; each value checks itself when made,
before anything is listed or read. Nothing here reads storage.
"""

from __future__ import annotations

import dataclasses
import numbers
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

import torch

from .batching import Packing, TokenBudget
from .convert import Output
from .errors import InvalidArgumentError
from .errors.keywords import SuggestsKeywords, check_flags, check_positive
from .errors.on_error import ON_ERROR, OnError
from .formats import Format
from .fs import Paths, RetryPolicy, StorageBackend, StorageOptions
from .loader import DEFAULT_BUNDLE_ROWS, TabularDataLoader
from .planning import REMAINDER_POLICIES, SPLIT_STRATEGIES, Layout, Remainder, SplitStrategy
from .state import Readable
from .stream.blocks import DEFAULT_SHUFFLE_BLOCK_BYTES, block_sizes
from .tokenizing import Derivation, Tokenize, Transform

_D = TypeVar("_D", bound=Readable)

__all__ = [
    "DEFAULT_BATCH_SIZE",
    "EVERY_SOURCE",
    "LOADER_KEYWORDS",
    "LoaderOptions",
    "OPTION_KEYWORDS",
    "Options",
    "Source",
    "ranks_of",
    "source_keywords",
    "with_defaults",
]


# Rows a batch holds when batch_size is not given (the dataset constructors' default too).
DEFAULT_BATCH_SIZE = 1024

# Marks a `Source` field that a mixture's own keyword arguments may set for every source that
# leaves it unset.
_EVERY = {"every_source": True}
# Marks a `Source` field that only one kind of source takes (``reads``: files or a table), or
# only a source of a mixture: the keywords each dataset takes follow (`dataset.keywords`).
_FILES, _TABLE, _MIXED = {"reads": "files"}, {"reads": "table"}, {"reads": "mixture"}


@dataclass(frozen=True)
class Source(SuggestsKeywords):
    """One source of data: files (``path``), a table at a path (``path`` with ``format="delta"``
    or ``"lance"``) or an Iceberg table by name (``table``), with the options of reading it; in a
    mixture, also its weight.

    Args:
        path: a path or URL, a directory, a glob, a brace pattern, or a list of them; or the
            location of a Delta Lake table or a Lance dataset.
        format: the format of the files (``"parquet"``, ``"webdataset"``, ...), or the kind
            of the table at ``path`` (``"delta"``, ``"lance"``).
        table: an Iceberg table name (``"db.table"``), read through ``catalog_config``.
        weight: the source's share of each epoch's rows, relative to the other sources'
            (default: 1 when another source has a weight; when none has, the sources share
            the epoch in proportion to their rows).
        name: a name for messages (default: the path or table).
        columns, filters, storage_options, format_options, partitioning, split_bytes,
            split_rows, storage_backend, retries: as for one source (`StructuredDataset`).
        version: the version of a table to read: a Delta or Lance version number, an Iceberg
            snapshot id (as ``snapshot_id``). Default: the latest at planning, pinned.
        as_of: read the table's version current at this time (a ``datetime``, an ISO 8601
            string or epoch milliseconds).
        catalog_config, snapshot_id, ref, from_snapshot_id: the Iceberg table's catalog and
            snapshot (`IcebergDataset`).
        tokenize: a text column tokenized in the loader (`tdu.Tokenize`), counted once by the
            census before epoch 0 (docs/concepts/census.md).
        transform: a function over each record batch of its rows run before tokenizing
            (`tdu.Transform`, with a fingerprint); it may drop rows.

    Raises:
        InvalidArgumentError: an option is out of range or of the wrong kind.
        UnknownKeywordError: a keyword it does not take; the message names the closest one.

    Examples:
        >>> import torch_dataloader_utils as tdu  # doctest: +SKIP
        >>> loader = tdu.create_dataloader(
        ...     [tdu.Source("web/", weight=3), tdu.Source("code/", weight=1)],
        ...     epoch_rows=1_000_000, batch_size=1024, shuffle=True)
    """

    path: Paths | None = field(default=None, metadata=_FILES)
    format: str | Format = "parquet"
    table: Any = field(default=None, metadata=_TABLE)
    weight: float | None = field(default=None, metadata=_MIXED)
    name: str | None = field(default=None, metadata=_MIXED)
    columns: Sequence[str] | None = field(default=None, metadata=_EVERY)
    filters: Any = field(default=None, metadata=_EVERY)
    storage_options: StorageOptions | None = field(default=None, metadata=_EVERY)
    format_options: Mapping[str, Any] | None = field(default=None, metadata=_EVERY)
    partitioning: str | None = field(default=None, metadata=_EVERY)
    split_bytes: int | None = field(default=None, metadata=_EVERY)
    split_rows: int | None = field(default=None, metadata=_EVERY)
    storage_backend: StorageBackend = "auto"
    retries: RetryPolicy | int | None = field(default=None, metadata=_EVERY)
    catalog_config: Mapping[str, Any] | None = field(
        default=None, repr=False, metadata={**_EVERY, **_TABLE}
    )
    snapshot_id: int | None = field(default=None, metadata=_TABLE)
    # (A table read by path, Delta or Lance, takes ``version`` and ``as_of`` too: not ``_TABLE``.)
    version: int | str | None = None
    as_of: Any = None
    ref: str | None = field(default=None, metadata=_TABLE)
    from_snapshot_id: int | None = field(default=None, metadata=_TABLE)
    tokenize: Tokenize | None = field(default=None, metadata=_EVERY)
    transform: Transform | None = field(default=None, metadata=_EVERY)

    def __post_init__(self) -> None:
        if (self.path is None) == (self.table is None):
            raise InvalidArgumentError(
                "a Source reads either path= (files, or a Delta or Lance table) or table= "
                "(an Iceberg table by name)"
            )
        _check_derived(self.tokenize, self.transform)
        if self.weight is not None and not (self.weight >= 0):
            raise InvalidArgumentError(f"a Source's weight must be >= 0, got {self.weight}")
        check_positive(split_bytes=self.split_bytes, split_rows=self.split_rows)
        if self.partitioning not in (None, "hive"):
            raise InvalidArgumentError(
                f'partitioning must be None or "hive", got {self.partitioning!r}'
            )
        _check_columns(self.columns)
        if self.version is not None and self.snapshot_id is not None:
            raise InvalidArgumentError(
                f"version={self.version!r} and snapshot_id={self.snapshot_id!r}: pass one "
                "(for an Iceberg table they name the same thing)"
            )
        if self.table is None:
            return
        if self.partitioning is not None:
            raise InvalidArgumentError(
                "partitioning does not apply to Iceberg tables: their partitions come from the "
                "table's metadata"
            )
        if self.catalog_config is not None and not isinstance(self.catalog_config, Mapping):
            raise InvalidArgumentError(
                f"catalog_config must be a mapping of catalog properties, got "
                f"{type(self.catalog_config).__name__}"
            )

    @property
    def derive(self) -> Derivation | None:
        """What reads compute from its rows (``None``: nothing)."""
        return Derivation.of(self.transform, self.tokenize)

    @property
    def label(self) -> str:
        """The source's name in messages."""
        if self.name:
            return self.name
        if self.table is not None:
            return self.table if isinstance(self.table, str) else ".".join(self.table)
        path = self.path
        if isinstance(path, str | os.PathLike):
            return os.fspath(path)
        return ", ".join(os.fspath(p) for p in path or ())

    @property
    def first_path(self) -> str:
        """The first path (or the table's name): its protocol names the filesystem."""
        path = self.path if self.path is not None else self.label
        return os.fspath(path if isinstance(path, str | os.PathLike) else next(iter(path), ""))


# The `Source` fields a mixture's keyword arguments may give for every source.
EVERY_SOURCE = tuple(f.name for f in dataclasses.fields(Source) if f.metadata.get("every_source"))


def with_defaults(source: Source, defaults: Mapping[str, Any]) -> Source:
    """``source`` with the options it leaves unset taken from ``defaults``."""
    unset = {k: v for k, v in defaults.items() if getattr(source, k) is None}
    return dataclasses.replace(source, **unset) if unset else source


@dataclass(frozen=True)
class Options:
    """The options of a dataset besides its sources': how its epochs are ordered and cut, on
    which ranks, what a failed read does, the node-local cache, and the conversion.

    Attributes are `StructuredDataset`'s arguments of the same names (``output`` holds
    ``output_format``, ``list_format``, ``null_policy`` and ``pad_value``).

    Raises:
        InvalidArgumentError: an option is out of range or of the wrong kind.
    """

    batch_size: int = DEFAULT_BATCH_SIZE
    shuffle: bool = False
    shuffle_seed: int = 42
    drop_last: bool = False
    shuffle_block_size: int | None = None
    shuffle_block_bytes: int = DEFAULT_SHUFFLE_BLOCK_BYTES
    rank: int | None = None
    world_size: int | None = None
    remainder: Remainder = "drop"
    split_strategy: SplitStrategy = "equal"
    on_error: OnError = "raise"
    collate_fn: Callable[[Any], Any] | None = None
    cache_dir: str | os.PathLike[str] | None = None
    cache_limit: int | str | None = None
    census_dir: str | os.PathLike[str] | None = None
    output: Output = field(default_factory=Output)
    packing: Packing | None = None
    batching: TokenBudget | None = None

    def __post_init__(self) -> None:
        check_positive(batch_size=self.batch_size, shuffle_block_bytes=self.shuffle_block_bytes)
        check_positive(shuffle_block_size=self.shuffle_block_size)
        if self.shuffle_seed < 0:
            raise InvalidArgumentError(f"shuffle_seed must be >= 0, got {self.shuffle_seed}")
        if self.remainder not in REMAINDER_POLICIES:
            raise InvalidArgumentError(
                f"remainder must be one of {REMAINDER_POLICIES}, got {self.remainder!r}"
            )
        if self.split_strategy not in SPLIT_STRATEGIES:
            raise InvalidArgumentError(
                f"split_strategy must be one of {SPLIT_STRATEGIES}, got {self.split_strategy!r}"
            )
        if self.on_error not in ON_ERROR:
            raise InvalidArgumentError(f"on_error must be one of {ON_ERROR}, got {self.on_error!r}")
        check_flags(shuffle=self.shuffle, drop_last=self.drop_last)
        if self.packing is not None:
            if not isinstance(self.packing, Packing):
                raise InvalidArgumentError(
                    f"packing must be a tdu.Packing, got {type(self.packing).__name__}"
                )
            if self.packing.batch_tokens(self.batch_size) < 1:
                raise InvalidArgumentError("Packing's fill leaves a batch no token")
            if self.output.format not in ("torch", "numpy"):
                raise InvalidArgumentError(
                    'packed sequences are torch tensors or numpy arrays: output_format="torch" '
                    'or "numpy"'
                )
        if self.batching is not None:
            if not isinstance(self.batching, TokenBudget):
                raise InvalidArgumentError(
                    f"batching must be a tdu.TokenBudget, got {type(self.batching).__name__}"
                )
            if self.packing is not None:
                raise InvalidArgumentError(
                    "packing= and batching= both make the batches: pass one of them"
                )
            # (the default passes: the dataset constructors hand it on whether given or not)
            if self.batch_size != DEFAULT_BATCH_SIZE:
                raise InvalidArgumentError(
                    f"batch_size={self.batch_size} with batching={self.batching}: the token "
                    "budget replaces batch_size (each batch holds the rows its max_tokens "
                    "allows); leave batch_size unset"
                )
            if self.split_strategy != "equal":
                raise InvalidArgumentError(
                    'token-budget batches are cut from equal streams: split_strategy="equal"'
                )

    @classmethod
    def split(cls, keywords: Mapping[str, Any]) -> tuple[Options, dict[str, Any]]:
        """The options among ``keywords`` (the public names: ``output_format``, ``num_ranks``,
        ...), and the rest (a source's)."""
        own = {f.name for f in dataclasses.fields(cls)} - {"output"}
        rest = dict(keywords)
        mine = {k: rest.pop(k) for k in own if k in rest}
        output = {k: rest.pop(f"{p}{k}") for p, k in _OUTPUT if f"{p}{k}" in rest}
        world_size = ranks_of(mine.pop("world_size", None), rest.pop("num_ranks", None))
        return cls(**mine, world_size=world_size, output=Output(**output)), rest

    @property
    def seq_tokens(self) -> int:
        """A packed dataset's tokens of its order per sequence (0: not packed)."""
        return 0 if self.packing is None else self.packing.seq_tokens

    @property
    def batch_rows(self) -> int:
        """Rows of the order a batch holds: ``batch_size`` rows, or a packed dataset's
        ``batch_size`` sequences' tokens (its order is one of tokens)."""
        return self.batch_size * max(1, self.seq_tokens)

    def layout(self, *, row_bytes: float, chunk_rows: float, group: int | None = None) -> Layout:
        """Every option that decides which rows each stream reads and in what order, with block
        sizes for rows of ``row_bytes`` decoded bytes in chunks of ``chunk_rows`` rows
        (``group``: a token budget's rows a planner's batch, `planning.budget`)."""
        batch_rows = self.batch_rows if group is None else group
        block_rows, first_block_rows = block_sizes(
            batch_size=batch_rows,
            block_size=self.shuffle_block_size,
            block_bytes=self.shuffle_block_bytes,
            row_bytes=row_bytes,
            chunk_rows=chunk_rows,
        )
        return Layout(
            batch_size=batch_rows,
            shuffle=self.shuffle,
            seed=self.shuffle_seed,
            drop_last=self.drop_last,
            remainder=self.remainder,
            block_rows=block_rows,
            first_block_rows=first_block_rows,
            strategy=self.split_strategy,
            seq_tokens=self.seq_tokens,
        )


@dataclass(frozen=True)
class LoaderOptions:
    """`create_dataloader`'s options of the DataLoader (as it documents them), checked when
    made: before the dataset is planned.

    Raises:
        InvalidArgumentError: an option is out of range or of the wrong kind.
    """

    num_workers: int | str | None = None
    pin_memory: bool = False
    persistent_workers: bool = False
    prefetch_factor: int | None = None
    multiprocessing_context: Any = None
    timeout: float = 0
    worker_init_fn: Callable[[int], None] | None = None
    bundle_rows: int = DEFAULT_BUNDLE_ROWS
    device: torch.device | str | None = None
    accelerator: Any = None

    def __post_init__(self) -> None:
        check_flags(persistent_workers=self.persistent_workers, pin_memory=self.pin_memory)
        workers: object = self.num_workers
        auto = workers == "auto"  # (decided once the data is planned: `metrics.workers`)
        if not auto and workers is not None:
            if isinstance(workers, bool) or not isinstance(workers, numbers.Integral):
                raise InvalidArgumentError(f'num_workers must be an int or "auto", got {workers!r}')
            if workers < 0:
                raise InvalidArgumentError(f"num_workers must be >= 0, got {workers}")
        if self.bundle_rows < 0:
            raise InvalidArgumentError(f"bundle_rows must be >= 0, got {self.bundle_rows}")
        if self.persistent_workers and not auto and self.workers == 0:
            raise InvalidArgumentError("persistent_workers=True needs num_workers > 0")

    @property
    def workers(self) -> int:
        """Worker processes (default: ``min(4, cpu_count)``)."""
        if self.num_workers == "auto":
            raise InvalidArgumentError('num_workers="auto" is decided by create_dataloader')
        if self.num_workers is None:
            return min(4, os.cpu_count() or 1)
        return int(self.num_workers)

    def loader(self, dataset: _D) -> TabularDataLoader[_D]:
        """A `TabularDataLoader` over ``dataset`` with these options."""
        extra: dict[str, Any] = {}
        if self.workers > 0:  # DataLoader refuses these without workers
            extra["persistent_workers"] = self.persistent_workers
            extra["prefetch_factor"] = self.prefetch_factor
            extra["multiprocessing_context"] = self.multiprocessing_context
            extra["timeout"] = self.timeout
        return TabularDataLoader(
            dataset,
            num_workers=self.workers,
            bundle_rows=self.bundle_rows,
            worker_init_fn=self.worker_init_fn,
            pin_memory=self.pin_memory,
            device=self.device,
            accelerator=self.accelerator,
            **extra,
        )


# The keywords `create_dataloader` gives the loader (the others build the dataset).
LOADER_KEYWORDS = tuple(f.name for f in dataclasses.fields(LoaderOptions))


# `Output`'s fields under their public names (``output_format``, ``list_format``, ...).
_OUTPUT = (("output_", "format"), ("", "list_format"), ("", "null_policy"), ("", "pad_value"))

# `Options` as keywords: its fields, ``output``'s under their public names, and ``num_ranks``
# (the earlier library's ``world_size``).
OPTION_KEYWORDS = frozenset(
    {f.name for f in dataclasses.fields(Options)} - {"output"}
    | {p + k for p, k in _OUTPUT}
    | {"num_ranks"}
)


def source_keywords(reads: str) -> frozenset[str]:
    """The `Source` fields a dataset of one source of kind ``reads`` (``"files"`` or
    ``"table"``) takes as keywords: every field but the other kind's and a mixture's."""
    return frozenset(
        f.name for f in dataclasses.fields(Source) if f.metadata.get("reads") in (None, reads)
    )


def ranks_of(world_size: int | None, num_ranks: int | None) -> int | None:
    """``world_size``, or ``num_ranks`` (the earlier library's name for it).

    Raises:
        InvalidArgumentError: both are given and disagree.
    """
    if num_ranks is None:
        return world_size
    if world_size is not None and world_size != num_ranks:
        raise InvalidArgumentError(
            f"num_ranks={num_ranks} and world_size={world_size} disagree; pass one"
        )
    return num_ranks


def _check_derived(tokenize: object, transform: object) -> None:
    """Refuse a ``tokenize`` or ``transform`` of the wrong kind (a bare function: say how to
    give it a fingerprint)."""
    if tokenize is not None and not isinstance(tokenize, Tokenize):
        raise InvalidArgumentError(
            f"tokenize must be a tdu.Tokenize, got {type(tokenize).__name__}"
        )
    if transform is not None and not isinstance(transform, Transform):
        hint = ' (wrap it: tdu.Transform(function, fingerprint="v1"))'
        raise InvalidArgumentError(
            f"transform must be a tdu.Transform, got {type(transform).__name__}"
            + (hint if callable(transform) else "")
        )


def _check_columns(columns: Sequence[str] | None) -> None:
    if columns is None:
        return
    if isinstance(columns, str):
        raise InvalidArgumentError(f"columns must be a list of names, got the string {columns!r}")
    if not isinstance(columns, Sequence):  # (an iterator would be used up by this check)
        raise InvalidArgumentError(f"columns must be a list of names, got {type(columns).__name__}")
    names = list(columns)
    if not names:  # an empty list reads no column: surely a mistake (None reads them all)
        raise InvalidArgumentError("columns must name at least one column (None: all of them)")
    bad = [c for c in names if not isinstance(c, str)]
    if bad:
        raise InvalidArgumentError(f"columns must be names (str), got {bad[0]!r}")
