"""Mixtures: several sources (Parquet directories, WebDataset shards, Iceberg tables...) in one
dataset, each with its weight, every epoch exactly its quota of rows (`planning.mixture`)."""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from typing import Any

import pyarrow as pa

from ..errors import InvalidArgumentError, SchemaMismatchError
from ..loader import TabularDataLoader
from ..options import LOADER_KEYWORDS, LoaderOptions, Options, Source, with_defaults
from ..planning import Chunks, Layout, Plan
from ..planning.interleave import MIXINGS, Mixing
from ..planning.mixture import Mixture, quotas
from ..planning.schedule import Schedule
from ..planning.streams import Mixed
from ..sources.planned import PlannedSource
from .base import Combined, PlannedDataset

__all__ = ["MixtureDataset"]

logger = logging.getLogger(__name__)


class MixtureDataset(PlannedDataset):
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
        weights_schedule: ``[(step, [weight of each source]), ...]`` from step 0: from each
            step (a batch of every rank, counted from epoch 0's first batch) the weights are
            these, instead of the sources' own (docs/concepts/order.md). Each source goes on
            where it stopped; steps count batches of the world size and batch size the first
            pass had (kept in its state).
        **options: what `StructuredDataset` takes besides the per-source ones (``batch_size``,
            ``shuffle``, ``shuffle_seed``, ``output_format``, ``drop_last``, ``rank``,
            ``cache_dir``, ``cache_limit``, ...), and, for every source that leaves them
            unset, ``columns``, ``filters``, ``storage_options``, ``format_options``,
            ``partitioning``, ``split_bytes``, ``split_rows``, ``retries`` and
            ``catalog_config``. One cache serves every source.

    Raises:
        SchemaMismatchError: the sources yield different columns, or types that do not widen
            to one.
        InvalidArgumentError: an option is out of range (a weight below 0, no source with a
            weight, a source with a quota but no rows).
    """

    _reads = "mixture"

    def __init__(
        self,
        sources: Sequence[Source],
        *,
        epoch_rows: int | None = None,
        mixing: Mixing = "random",
        source_column: str | None = None,
        weights_schedule: Sequence[tuple[int, Sequence[float]]] | None = None,
        **options: Any,
    ) -> None:
        given = list(sources)
        if not given or not all(isinstance(s, Source) for s in given):
            raise InvalidArgumentError("a mixture takes a non-empty list of tdu.Source")
        self.schedule = None
        if weights_schedule is not None:
            self.schedule = Schedule.of(weights_schedule, len(given))
            weighed = [s.label for s in given if s.weight is not None]
            if weighed:
                raise InvalidArgumentError(
                    f"weights_schedule gives the weights: leave weight= unset on the sources "
                    f"({', '.join(map(repr, weighed))})"
                )
        if mixing not in MIXINGS:
            raise InvalidArgumentError(f"mixing must be one of {MIXINGS}, got {mixing!r}")
        if epoch_rows is not None and (not isinstance(epoch_rows, int) or epoch_rows < 0):
            raise InvalidArgumentError(f"epoch_rows must be an int >= 0, got {epoch_rows!r}")
        settings, defaults = Options.split(options)
        if settings.split_strategy != "equal":
            raise InvalidArgumentError(
                'a mixture cuts its epochs into equal streams: split_strategy="equal" only'
            )
        self._weights = [s.weight for s in given]
        self._asked_rows = epoch_rows
        self.mixing: Mixing = mixing
        self.source_column = source_column
        sources = tuple(with_defaults(s, defaults) for s in given)
        self._build(sources, settings)
        logger.info(
            "mixture of %d sources, %s rows an epoch (%s), mixing=%s",
            len(self.sources),
            sum(self.quotas),
            ", ".join(f"{s.label}: {q}" for s, q in zip(self.sources, self.quotas, strict=True)),
            mixing,
        )

    def _combine(self, sources: tuple[PlannedSource, ...]) -> Combined:
        """One plan of every source's chunks, the quotas, and the streams of the interleave."""
        schema = _schema(sources)
        if self.source_column is not None:
            if self.source_column in schema.names:
                raise InvalidArgumentError(
                    f"source_column={self.source_column!r} is already a column of the sources"
                )
            schema = schema.append(pa.field(self.source_column, pa.int64(), nullable=False))
        rows = [int(s.plan.chunk_rows.sum()) for s in sources]
        weights = self._weights
        given = None
        if any(w is not None for w in weights):
            given = [w if w is not None else 1.0 for w in weights]
        if self.schedule is not None:
            given = list(self.schedule.weights[0])
        # A packed mixture's rows are tokens, given to the sources a sequence at a time: each
        # quota whole sequences (what is left of a source's pass opens its next epoch).
        turn = max(1, self.options.seq_tokens)
        asked = None if self._asked_rows is None else self._asked_rows // turn
        self.quotas = tuple(turn * q for q in quotas([r // turn for r in rows], given, asked))
        mixture = Mixture(
            tuple(s.plan.chunk_rows for s in sources), self.quotas, self.mixing, self.schedule
        )
        total = sum(self.quotas)
        # The footers' bytes per row, weighted by the quotas: a mixture's blocks are sized as
        # they were before sources were sampled (ADR 0021, "left alone").
        row_bytes = (
            sum(s.plan.row_bytes * q for s, q in zip(sources, self.quotas, strict=True)) / total
            if total
            else 1.0
        )
        files: dict[str, tuple[int, str]] = {}
        for s in sources:
            files.update(s.plan.files)
        # The state's identity: every source's plan, the quotas and the mixing.
        identity = {
            "sources": [s.plan.fingerprint for s in sources],
            "quotas": list(self.quotas),
            "mixing": self.mixing,
            "source_column": self.source_column,
            **({"schedule": self.schedule.identity()} if self.schedule is not None else {}),
        }
        plan = Plan(
            chunks=Chunks.concat([s.plan.chunks for s in sources]),
            schema=schema,
            row_bytes=row_bytes,
            details=Plan.details_of(mixture=json.dumps(identity), **_derived(sources)),
            files=files,
        )

        def streams(layout: Layout) -> Mixed:
            return Mixed(mixture, layout)

        return Combined(plan, row_bytes, streams)

    @property
    def _source_key(self) -> str | None:
        return self.source_column

    def _mixing(self) -> dict[str, Any]:
        schema = pa.schema([*self.plan.schema, *(pa.field(c, pa.string()) for c in self._carried)])
        if self.source_column is not None:
            schema = schema.remove(schema.get_field_index(self.source_column))
        return {"schema": schema, "source_column": self.source_column}

    @property
    def schema(self) -> pa.Schema:
        """The schema of the mixture's rows (every source's cast to it)."""
        return self.plan.schema

    @classmethod
    def create_dataloader(
        cls, sources: Sequence[Source], **kwargs: Any
    ) -> tuple[TabularDataLoader[MixtureDataset], MixtureDataset]:
        """Build the mixture and a DataLoader over it; see `create_dataloader` for the loader's
        options and `MixtureDataset` for the mixture's.

        Returns:
            ``(loader, dataset)``: call ``dataset.set_epoch(epoch)`` before each epoch.

        Raises:
            InvalidArgumentError: an option is out of range.
            UnknownKeywordError: a keyword neither the loader nor the mixture takes.
        """
        given = dict(kwargs)
        loading = LoaderOptions(**{k: given.pop(k) for k in LOADER_KEYWORDS if k in given})
        loader = loading.loader(cls(sources, **given))
        return loader, loader.dataset

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(sources={[s.label for s in self.sources]}, "
            f"quotas={list(self.quotas)}, mixing={self.mixing!r}, "
            f"batch_size={self.batch_size}, shuffle={self.shuffle})"
        )


def _schema(sources: Sequence[PlannedSource]) -> pa.Schema:
    """The schema every source's rows are cast to: the first source's column order, each
    column's type the one all sources' types widen to."""
    first = sources[0].plan.schema
    for source in sources[1:]:
        schema = source.plan.schema
        if set(schema.names) != set(first.names):
            missing = sorted(set(first.names) - set(schema.names))
            extra = sorted(set(schema.names) - set(first.names))
            raise SchemaMismatchError(
                f"the sources of a mixture must yield the same columns: {source.label!r} "
                f"lacks {missing} and adds {extra} compared with {sources[0].label!r} "
                f"({first.names}); select the same columns with each Source's columns="
            )
    ordered = [pa.schema([s.plan.schema.field(n) for n in first.names]) for s in sources]
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


def _derived(sources: Sequence[PlannedSource]) -> dict[str, str]:
    """The fingerprints of what the sources compute from their rows (a tokenizer, a
    transform), each source's in order ("none" where it has none), so that a state names
    which changed."""
    found = {}
    for key in ("tokenizer", "transform"):
        each = [dict(s.plan.details).get(key, "none") for s in sources]
        if any(one != "none" for one in each):
            found[key] = "/".join(each)
    return found
