"""A dataset's sources planned in one step: on rank 0 (the others receive the plans), each
source in its own thread (`plan_sources`), each the same value (`PlannedSource`)."""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np

from ..formats import Format, ReadOptions
from ..fs import FileSystemSpec
from ..fs.threads import SOURCE_THREADS
from ..planning import Plan
from ..tokenizing import Derivation
from .broadcast import Spread
from .files import Planned

__all__ = ["PlannedSource", "plan_sources", "planned_source"]


@dataclass(frozen=True)
class PlannedSource:
    """One source as planning left it: everything a worker needs to read it.

    Attributes:
        label: the source's name in messages.
        plan: its plan.
        format: its format (each process reads with its own copy, as constructed).
        fs: its storage, with this rank's storage options, backend and retries.
        read_options: the columns read, the filter, what the format's plan learned.
        output_columns: the columns its batches carry, when not all read columns.
        row_bytes: decoded bytes per row (the larger of the footers' and a sample's).
        immutable: its files are never rewritten under their names (an Iceberg table's), so
            a file's size alone identifies it for the cache.
        chunk_tokens: a packed dataset's: each chunk's tokens (`Planned.chunk_tokens`).
        row_lengths: a token budget's: each row's length (`Planned.row_lengths`).
        derive: what reads compute from its rows (the source's own, never sent between ranks).
    """

    label: str
    plan: Plan
    format: Format
    fs: FileSystemSpec
    read_options: ReadOptions
    output_columns: tuple[str, ...] | None
    row_bytes: float
    immutable: bool = False
    chunk_tokens: tuple[int, ...] | None = None
    row_lengths: np.ndarray | None = None
    derive: Derivation | None = None


def plan_sources(
    count: int,
    plan: Callable[[int, Spread], Planned],
    *,
    explicit: bool,
) -> list[Planned]:
    """``plan(i, spread)`` for each of ``count`` sources. When torch.distributed is up and the
    rank was not ``explicit``, on every rank, one source after another (each plan's steps run
    on the ranks its `Spread` says: rank 0 lists, every rank reads a share of the footers);
    else here, the sources in threads."""
    spread = Spread(explicit=explicit)
    if spread.active or count == 1:
        return [plan(i, spread) for i in range(count)]
    with ThreadPoolExecutor(min(count, SOURCE_THREADS), "tdu-sources") as pool:
        return list(pool.map(lambda i: plan(i, spread), range(count)))


def planned_source(
    label: str,
    planned: Planned,
    fmt: Format,
    fs: FileSystemSpec,
    *,
    immutable: bool = False,
    derive: Derivation | None = None,
) -> PlannedSource:
    """The `PlannedSource` of ``planned`` (rank 0's plan) on this rank's filesystem ``fs``.

    Storage that planning found (an Iceberg table's) is read with this rank's options over it.
    """
    if planned.fs is not None:
        fs = planned.fs.under(fs)
    return PlannedSource(
        label=label,
        plan=planned.plan,
        format=fmt,
        fs=fs,
        read_options=planned.read_options,
        output_columns=planned.output_columns,
        row_bytes=max(planned.plan.row_bytes, planned.decoded_row_bytes),
        immutable=immutable,
        chunk_tokens=planned.chunk_tokens,
        row_lengths=planned.row_lengths,
        derive=derive,
    )
