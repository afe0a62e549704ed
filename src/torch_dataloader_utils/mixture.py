"""Mixtures: several sources (Parquet directories, WebDataset shards, Iceberg tables...) in one
loader, each with its weight, every epoch exactly its quota of rows (`planning.mixture`)."""

from __future__ import annotations

import functools
import json
import logging
import os
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pyarrow as pa

from .cache import CacheStats
from .convert import Converter, Decoding, ListFormat, NullPolicy, OutputFormat
from .dataset import StructuredDataset
from .errors import InvalidArgumentError, SchemaMismatchError, UnsupportedTypeError
from .keywords import check_keywords, keywords_of
from .options import check_arguments
from .planning import Chunks, Iteration, Layout, Plan, Ranks, Remainder, Topology, strategy_of
from .planning.interleave import MIXINGS, Mixing
from .planning.mixture import Mixture, quotas, source_layouts
from .skipping import OnError
from .source import SOURCE_DEFAULTS, Source, with_defaults
from .sources.broadcast import plan_once, planned_by
from .state import Passes
from .stream.blocks import DEFAULT_SHUFFLE_BLOCK_BYTES, Segment, block_sizes
from .stream.mix import MixStream, mixed_segments, resolve_mix

__all__ = ["MixtureDataset"]

logger = logging.getLogger(__name__)


# Sources planned at once (each plans its files in its own threads too).
_PLAN_SOURCES = 8


def _schema(sources: Sequence[Source], schemas: Sequence[pa.Schema]) -> pa.Schema:
    """The schema every source's rows are cast to: the first source's column order, each
    column's type the one all sources' types widen to."""
    first = schemas[0]
    for source, schema in zip(sources[1:], schemas[1:], strict=True):
        if set(schema.names) != set(first.names):
            missing = sorted(set(first.names) - set(schema.names))
            extra = sorted(set(schema.names) - set(first.names))
            raise SchemaMismatchError(
                f"the sources of a mixture must yield the same columns: {source.label!r} "
                f"lacks {missing} and adds {extra} compared with {sources[0].label!r} "
                f"({first.names}); select the same columns with each Source's columns="
            )
    ordered = [pa.schema([s.field(n) for n in first.names]) for s in schemas]
    try:
        return pa.unify_schemas(ordered, promote_options="permissive")
    except (pa.ArrowInvalid, pa.ArrowTypeError) as exc:
        types = "; ".join(
            f"{source.label!r}: {schema}".replace("\n", ", ")
            for source, schema in zip(sources, ordered, strict=True)
        )
        raise SchemaMismatchError(
            f"the sources of a mixture hold columns of types that do not widen to one ({exc}): "
            f"{types}"
        ) from exc


def _plan_sources(
    sources: Sequence[Source], shared: Mapping[str, Any], *, explicit: bool
) -> tuple[StructuredDataset, ...]:
    """Each source's dataset. The sources are planned at once, in threads, on rank 0 (or here,
    without torch.distributed), and their plans reach the other ranks in one broadcast."""
    built: list[StructuredDataset] = []

    def plan_all() -> list[Any]:
        plans: list[Any] = [None] * len(sources)

        def build(i: int) -> StructuredDataset:
            def keep(make: Callable[[], Any]) -> Any:
                plans[i] = make()
                return plans[i]

            with planned_by(keep):
                return sources[i].dataset(**shared)

        with ThreadPoolExecutor(min(len(sources), _PLAN_SOURCES), "tdu-sources") as pool:
            built.extend(pool.map(build, range(len(sources))))
        return plans

    plans = plan_once(plan_all, explicit=explicit)
    if built:  # planned here
        return tuple(built)
    parts = []
    for source, plan in zip(sources, plans, strict=True):
        with planned_by(functools.partial(_given_plan, plan)):
            parts.append(source.dataset(**shared))
    return tuple(parts)


def _given_plan(plan: Any, make: Callable[[], Any]) -> Any:
    """`plan_once` on the other ranks: the plan rank 0 made and broadcast."""
    return plan


class MixtureDataset(StructuredDataset):
    """Batches from several sources, each delivering its quota of rows every epoch.

    Source ``i`` delivers ``round(epoch_rows * w_i / sum(w))`` rows an epoch (largest
    remainders, so the quotas add up to ``epoch_rows``): a source smaller than its quota
    repeats (all of its rows before any twice), a larger one goes on next epoch where it
    stopped. The epoch is one sequence of positions cut into equal streams as for one source,
    so every rank yields the same batches, any ``num_workers`` reads it, and states resume
    exactly and elastically. See docs/concepts/mixtures.md.

    Args:
        sources: the `Source` objects.
        epoch_rows: rows an epoch across all ranks (default: every source's rows, split by the
            weights when they are given).
        mixing: ``"random"`` (default: each batch's rows drawn from the sources at random, each
            stretch of 16,384 positions holding each source's share) or ``"stratified"``
            (each batch holds each source's share within a row or two).
        source_column: also yield each row's source number (its index in ``sources``) under
            this name.
        **options: what `StructuredDataset` takes besides the per-source ones (``batch_size``,
            ``shuffle``, ``shuffle_seed``, ``output_format``, ``drop_last``, ``rank``,
            ``cache_dir``, ``cache_limit``, ...). One cache serves every source.

    Raises:
        SchemaMismatchError: the sources yield different columns, or types that do not widen
            to one.
        InvalidArgumentError: an option is out of range (a weight below 0, no source with a
            weight, a source with a quota but no rows).
    """

    def __init__(
        self,
        sources: Sequence[Source],
        *,
        epoch_rows: int | None = None,
        mixing: Mixing = "random",
        source_column: str | None = None,
        batch_size: int = 1024,
        shuffle: bool = False,
        shuffle_seed: int = 42,
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
        collate_fn: Callable[[Any], Any] | None = None,
        on_error: OnError = "raise",
        cache_dir: str | os.PathLike[str] | None = None,
        cache_limit: int | str | None = None,
        **defaults: Any,
    ) -> None:
        # (Not StructuredDataset.__init__: each source is planned by its own dataset.)
        torch_init = super(StructuredDataset, self).__init__
        torch_init()
        sources = list(sources)
        if not sources or not all(isinstance(s, Source) for s in sources):
            raise InvalidArgumentError("a mixture takes a non-empty list of tdu.Source")
        if mixing not in MIXINGS:
            raise InvalidArgumentError(f"mixing must be one of {MIXINGS}, got {mixing!r}")
        if epoch_rows is not None and (not isinstance(epoch_rows, int) or epoch_rows < 0):
            raise InvalidArgumentError(f"epoch_rows must be an int >= 0, got {epoch_rows!r}")
        world_size = check_arguments(
            batch_size=batch_size,
            columns=None,
            shuffle_seed=shuffle_seed,
            split_bytes=None,
            split_rows=None,
            partitioning=None,
            shuffle_block_size=shuffle_block_size,
            shuffle_block_bytes=shuffle_block_bytes,
            world_size=world_size,
            remainder=remainder,
            split_strategy="equal",
            num_ranks=None,
            on_error=on_error,
            shuffle=shuffle,
            drop_last=drop_last,
        )
        check_keywords(
            defaults,
            SOURCE_DEFAULTS,
            refusal=(
                "a mixture takes, besides its own options, only these for every source that "
                f"leaves them unset: {', '.join(SOURCE_DEFAULTS)} (options of one source go in "
                "its tdu.Source); it got"
            ),
            also=keywords_of(MixtureDataset.__init__)[0],
        )
        self.sources = tuple(with_defaults(s, defaults) for s in sources)
        self.collate_fn = collate_fn
        self.on_error = on_error
        self._failures = None
        self._ranks = Ranks(rank, world_size)
        self._reading = None
        self.mixing: Mixing = mixing
        self.source_column = source_column
        # Each source planned by its own dataset (rank 0 plans, the others receive it).
        shared = {
            "batch_size": batch_size,
            "output_format": output_format,
            "list_format": list_format,
            "null_policy": null_policy,
            "pad_value": pad_value,
            "rank": rank,
            "world_size": world_size,
            "on_error": on_error,
            "cache_dir": cache_dir,
            "cache_limit": cache_limit,
        }
        self.parts = _plan_sources(self.sources, shared, explicit=rank is not None)
        schema = _schema(self.sources, [p.plan.schema for p in self.parts])
        if source_column is not None:
            if source_column in schema.names:
                raise InvalidArgumentError(
                    f"source_column={source_column!r} is already a column of the sources"
                )
            schema = schema.append(pa.field(source_column, pa.int64(), nullable=False))
        self.schema = schema
        rows = [int(p.plan.chunk_rows.sum()) for p in self.parts]
        weights = [s.weight for s in self.sources]
        if any(w is not None for w in weights):
            given = [w if w is not None else 1.0 for w in weights]
        else:
            given = None
        self.quotas = tuple(quotas(rows, given, epoch_rows))
        self.mixture = Mixture(tuple(p.plan.chunk_rows for p in self.parts), self.quotas, mixing)
        total = sum(self.quotas)
        row_bytes = (
            sum(p.plan.row_bytes * q for p, q in zip(self.parts, self.quotas, strict=True)) / total
            if total
            else 1.0
        )
        # The state's identity: every source's plan, the quotas and the mixing.
        files: dict[str, tuple[int, str]] = {}
        for p in self.parts:
            files.update(p.plan.files)
        details = Plan.details_of(
            mixture=json.dumps(
                {
                    "sources": [p.plan.fingerprint for p in self.parts],
                    "quotas": list(self.quotas),
                    "mixing": mixing,
                    "source_column": source_column,
                }
            )
        )
        self.plan = Plan(
            chunks=Chunks.concat([p.plan.chunks for p in self.parts]),
            schema=schema,
            row_bytes=row_bytes,
            details=details,
            files=files,
        )
        try:
            self.converter = Converter(
                schema,
                output_format=output_format,
                list_format=list_format,
                null_policy=null_policy,
                pad_value=pad_value,
            )
        except UnsupportedTypeError as exc:
            raise UnsupportedTypeError(f"a mixture of {len(self.sources)} sources: {exc}") from None
        block_rows, first_block_rows = block_sizes(
            batch_size=batch_size,
            block_size=shuffle_block_size,
            block_bytes=shuffle_block_bytes,
            row_bytes=row_bytes,
            chunk_rows=self.plan.num_rows / max(len(self.plan.chunks), 1),
        )
        self.layout = Layout(
            batch_size=batch_size,
            shuffle=shuffle,
            seed=shuffle_seed,
            drop_last=drop_last,
            remainder=remainder,
            block_rows=block_rows,
            first_block_rows=first_block_rows,
            strategy="equal",
        )
        strategy_of("equal").check(self.layout, self._ranks)
        self.passes = Passes(self.plan, self.layout, self._ranks, self.mixture)
        # A format's decoders (WebDataset's images, say) apply to the columns they name.
        decoders: dict[str, Any] = {}
        if output_format != "arrow":
            for part in self.parts:
                for name, decoder in part.format.decoders(part.plan.schema).items():
                    decoders.setdefault(name, decoder)
        self._collate = (
            Decoding(decoders, output_format=output_format, collate=collate_fn, on_error=on_error)
            if decoders
            else collate_fn
        )
        # Attributes of one source that a mixture has as a whole.
        self.format = self.parts[0].format
        self.fs = self.parts[0].fs
        self.cache = self.parts[0].cache
        self._cache_counter = None  # each source counts its own: `cache_stats` sums them
        self.read_options = self.parts[0].read_options
        self._output_columns = None
        logger.info(
            "mixture of %d sources, %s rows an epoch (%s), mixing=%s",
            len(self.sources),
            total,
            ", ".join(f"{s.label}: {q}" for s, q in zip(self.sources, self.quotas, strict=True)),
            mixing,
        )

    @property
    def epoch_rows(self) -> int:
        """Rows an epoch reads across all ranks, before the remainder policy."""
        return sum(self.quotas)

    @property
    def storage_retries(self) -> int:
        """Storage requests retried so far, over every source."""
        return sum(p.fs.retries.total for p in self.parts)

    @property
    def cache_stats(self) -> CacheStats | None:
        """What the node-local cache did, over every source; None without a cache."""
        counts = [p.cache_stats for p in self.parts]
        found = [c for c in counts if c is not None]
        return functools.reduce(lambda a, b: a + b, found) if found else None

    def source_layouts(self) -> list[Layout]:
        """Each source's block sizes in a fresh epoch."""
        return source_layouts(self.layout, self.quotas)

    def _resolve(self, iteration: Iteration, topology: Topology, done: int | None) -> MixStream:
        return resolve_mix(self.mixture, self.layout, iteration, topology, done=done)

    def _segments(self, stream: Any) -> Iterator[Segment]:
        readers = [part.reader(self.failure_log) for part in self.parts]
        schema = self.schema
        if self.source_column is not None:
            schema = schema.remove(schema.get_field_index(self.source_column))
        return mixed_segments(stream, readers, schema, source_column=self.source_column)

    def pieces(self, topology: Topology, epoch: int) -> list[Any]:
        raise TypeError("a mixture's streams read pieces of several sources: see MixStream")

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(sources={[s.label for s in self.sources]}, "
            f"quotas={list(self.quotas)}, mixing={self.mixing!r}, "
            f"batch_size={self.batch_size}, shuffle={self.shuffle})"
        )
