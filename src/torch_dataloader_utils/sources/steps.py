"""Planning a source of files in steps: over the ranks, and from what an earlier run kept.

1. Rank 0 lists the files. If the plan kept from the last run (`kept.KeptPlans`) was made
   from the same listing, it is the plan: nothing else is read. Otherwise rank 0 reads one
   file's schema and works out the read options (`files.prepare_source`).
2. Every rank reads the facts (footers) of its share of the files whose facts were not kept
   (a format planned file by file: `Format.per_file`), in its planning threads
   (`broadcast.Spread.share`).
3. Rank 0 assembles the plan from the facts, counts what the options count, keeps the result
   for the next run, and every rank receives it.

Without a process group of several ranks each step runs here, in order.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from ..formats import Format, FormatPlan
from ..fs import FileSystemSpec, Paths, SourceFile
from .broadcast import Gathered, Spread
from .files import (
    Counts,
    Planned,
    Prepared,
    count_chunks,
    finish_source,
    list_source,
    prepare_source,
)
from .kept import Kept, KeptPlans, facts_of, listing_digest

__all__ = ["plan_files"]

logger = logging.getLogger(__name__)

Cached = Callable[..., FileSystemSpec]


@dataclass(frozen=True)
class _Begun:
    """What step 1 sends every rank: the kept plan, or the source prepared and which of its
    files' facts are to be read."""

    done: Planned | None
    prepared: Prepared | None = None
    missing: tuple[int, ...] = ()
    listing: str = ""


def plan_files(
    path: Paths,
    fmt: Format,
    fs: FileSystemSpec,
    *,
    spread: Spread,
    kept: KeptPlans | None,
    cached: Cached | None,
    **options: Any,
) -> Planned:
    """``path``'s plan, on every rank (see the module docstring); ``options``: those of
    `files.prepare_source`. Call it on every rank of ``spread`` in the same order.

    Raises:
        Exception: planning's errors (`files.plan_source`), on every rank.
    """
    known: dict[str, Any] = {}  # (rank 0's: the kept facts still good)

    def begin() -> _Begun:
        files = list_source(path, fmt)(fs)
        listing = listing_digest(files)
        old = kept.load() if kept is not None else None
        if old is not None and old.listing == listing:
            logger.info("%s: planned from the plan kept in %s", path, kept and kept.path)
            return _Begun(old.planned)
        prepared = prepare_source(path, files, fmt, _through(cached, fs, files), **options)
        if old is not None and kept is not None and fmt.per_file:
            known.update(facts_of(kept.facts(old.listing), files))
        missing = tuple(i for i, f in enumerate(files) if f.path not in known)
        if known:
            logger.info(
                "%s: %d files' facts kept from the last run, %d to read",
                path,
                len(known),
                len(missing),
            )
        return _Begun(None, prepared, missing, listing)

    begun = spread.from_rank0(begin)
    if begun.done is not None:
        return begun.done
    prepared = begun.prepared
    assert prepared is not None

    def read(indexes: Sequence[int]) -> list[Any]:
        files = [prepared.files[i] for i in indexes]
        parts = [prepared.partitions[i] for i in indexes]
        fs.listed((f.path, f.size) for f in files)  # (rank 0's listing said: asked nothing)
        return fmt.facts(files, parts, _through(cached, fs, files), prepared.read_options)

    gathered = spread.share(begun.missing, read) if fmt.per_file else None
    facts: list[Any] = []  # (rank 0's: every file's, to keep)

    def assemble() -> FormatPlan:
        files, partitions = prepared.files, prepared.partitions
        here = _through(cached, fs, files)
        if gathered is None:
            return fmt.plan(files, partitions, here, prepared.read_options)
        fresh = iter(gathered.values())
        facts.extend(known[f.path] if f.path in known else next(fresh) for f in files)
        return fmt.assemble(files, partitions, facts, here, prepared.read_options)

    counting = prepared.counting
    counts: Gathered | None = None
    if spread.active and (
        prepared.filters is not None or counting["tokens"] or counting["lengths"]
    ):
        # Counting reads data: every rank counts a share of the chunks, from the plan.
        planned = spread.from_rank0(assemble)

        def count(chunks: Sequence[int]) -> list[Counts]:
            here = _through(cached, fs, prepared.files)
            return [count_chunks(prepared, planned, fmt, here, chunks)]

        counts = spread.share(range(len(planned.chunks)), count)

    def finish() -> Planned:
        done = planned if counts is not None else assemble()
        here = _through(cached, fs, prepared.files)
        counted = None if counts is None else _joined(counts.values())
        result = finish_source(prepared, done, fmt, here, counted)
        if kept is not None:
            files = prepared.files
            by_path = {f.path: (f.size, f.version, x) for f, x in zip(files, facts, strict=False)}
            kept.save(Kept(begun.listing, result, by_path))
        return result

    return spread.from_rank0(finish)


def _joined(parts: Sequence[Counts]) -> Counts:
    """The counts of each rank's share of the chunks, in order, as one."""

    def join(k: int) -> list[Any] | None:
        if parts[0][k] is None:
            return None
        return [x for part in parts for x in (part[k] or ())]

    return join(0), join(1), join(2)


def _through(cached: Cached | None, fs: FileSystemSpec, files: Sequence[SourceFile]) -> Any:
    """``fs``, reading ``files`` through the node-local cache when there is one (the listing
    just told each identity: nothing to check)."""
    if cached is None:
        return fs
    return cached(fs, {f.path: (f.size, f.version) for f in files}, trusted=True)
