"""Planning a source of files in steps: over the ranks, and from what was kept for a restart.

1. Rank 0 lists the files. If the plan kept before the restart (`kept.KeptPlans`) was made
   from the same listing, it is the plan: nothing else is read. Otherwise rank 0 reads one
   file's schema and works out the read options (`prepare.prepare_source`).
2. Every rank reads the facts (footers) of its share of the files whose facts were not kept
   (a format planned file by file: `Format.per_file`), in its planning threads
   (`broadcast.Spread.share`).
3. Rank 0 assembles the format's plan from the facts. What the options count by reading (a
   filter's rows, tokens, lengths) every rank counts a share of under a process group of
   several ranks, else rank 0 (`files.count_chunks`). Rank 0 finishes the plan
   (`files.finish_source`), keeps it for a restart, and every rank receives it.

Without a process group of several ranks each step runs here, in order. Each step is a method
of `_Steps`, from values to values; `plan_files` says where each runs.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from ..cache import ReadCache
from ..formats import Format, FormatPlan
from ..fs import FileSystemSpec, ListedFile, Paths
from .broadcast import Gathered, Spread
from .census import Census
from .files import Counts, Planned, count_chunks, finish_source
from .kept import Kept, KeptPlans, facts_of, listing_digest
from .prepare import Prepared, list_source, prepare_source

__all__ = ["plan_files"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class _Begun:
    """What step 1 sends every rank when no kept plan will do: the source prepared, which of
    its files' facts are to be read, and the listing's digest (`kept.listing_digest`)."""

    prepared: Prepared
    missing: tuple[int, ...]
    listing: str


def plan_files(
    path: Paths,
    fmt: Format,
    fs: FileSystemSpec,
    *,
    spread: Spread,
    kept: KeptPlans | None,
    cache: ReadCache | None,
    census: Census | None = None,
    **options: Any,
) -> Planned:
    """``path``'s plan, on every rank (see the module docstring); ``options``: those of
    `prepare.prepare_source`. Call it on every rank of ``spread`` in the same order.

    ``kept``: where the plans of this source and options are kept for a restart. ``cache``: the
    node-local cache planning reads through, so a second plan of the same files reads their
    footers, indexes and scans from it. ``census``: this rank's, for a source that computes
    from its rows (each rank counts its share of the chunks with its own tokenizer).

    Raises:
        StorageNotFoundError: ``path`` does not exist.
        ColumnNotFoundError: a column in ``options`` (columns, filters) is not in the data.
        SchemaMismatchError: files disagree on the columns read, or a hive key is a column.
        Exception: any other error of planning, on every rank.
    """
    steps = _Steps(path, fmt, fs, kept, cache, census)
    derive = None if census is None else census.derive
    begun = spread.from_rank0(partial(steps.begin, {**options, "derive": derive}))
    if isinstance(begun, Planned):  # (kept before the restart)
        return begun
    prepared = begun.prepared
    gathered = spread.share(begun.missing, partial(steps.read, prepared)) if fmt.per_file else None
    planned: FormatPlan | None = None
    counts: Gathered | None = None
    if spread.active and prepared.counts_by_reading:
        # Counting reads data: every rank counts a share of the chunks, from the plan.
        planned = spread.from_rank0(partial(steps.assemble, prepared, gathered))
        counts = spread.share(range(len(planned.chunks)), partial(steps.count, prepared, planned))
    return spread.from_rank0(partial(steps.finish, begun, gathered, planned, counts))


@dataclass
class _Steps:
    """The steps of planning one source. Rank 0 also holds what only it needs from one step to
    the next (never sent to the other ranks): the facts kept before the restart that are still
    good (``known``), and every file's facts, to keep for a restart (``facts``)."""

    path: Paths
    fmt: Format
    fs: FileSystemSpec
    kept: KeptPlans | None
    cache: ReadCache | None
    census: Census | None = None
    known: dict[str, Any] = field(default_factory=dict)
    facts: list[Any] = field(default_factory=list)

    def begin(self, options: dict[str, Any]) -> Planned | _Begun:
        """Step 1 (rank 0): the kept plan if the listing is unchanged, else the source
        prepared and the files whose facts are to be read."""
        files = list_source(self.path, self.fmt, self.fs)
        listing = listing_digest(files)
        old = self.kept.load() if self.kept is not None else None
        if old is not None and old.listing == listing:
            kept = self.kept
            logger.info("%s: planned from the plan kept in %s", self.path, kept and kept.path)
            planned: Planned = old.planned
            return planned
        prepared = prepare_source(self.path, files, self.fmt, self._through(files), **options)
        if old is not None and self.kept is not None and self.fmt.per_file:
            self.known.update(facts_of(self.kept.facts(old.listing), files))
        missing = tuple(i for i, f in enumerate(files) if f.path not in self.known)
        if self.known:
            logger.info(
                "%s: %d files' facts kept before the restart, %d to read",
                self.path,
                len(self.known),
                len(missing),
            )
        return _Begun(prepared, missing, listing)

    def read(self, prepared: Prepared, indexes: Sequence[int]) -> list[Any]:
        """Step 2 (every rank, its share): the facts of the files at ``indexes``."""
        share = prepared.listing.take(indexes)
        self.fs.listed((f.path, f.size) for f in share.files)  # (rank 0's listing: ask nothing)
        return self.fmt.facts(share, self._through(share.files), prepared.read_options)

    def assemble(self, prepared: Prepared, gathered: Gathered | None) -> FormatPlan:
        """Step 3 (rank 0): the format's plan; a format planned file by file assembles it from
        every file's facts, kept or ``gathered`` from the ranks."""
        listing = prepared.listing
        here = self._through(listing.files)
        if gathered is None:
            return self.fmt.plan(listing, here, prepared.read_options)
        fresh = iter(gathered.values())
        known = self.known
        self.facts = [known[f.path] if f.path in known else next(fresh) for f in listing.files]
        return self.fmt.assemble(listing, self.facts, here, prepared.read_options)

    def count(self, prepared: Prepared, planned: FormatPlan, chunks: Sequence[int]) -> list[Counts]:
        """Step 3 under a process group (every rank, its share): what the options count by
        reading, of the plan's ``chunks``."""
        here = self._through(prepared.listing.files)
        return [count_chunks(prepared, planned, self.fmt, here, chunks, census=self.census)]

    def finish(
        self,
        begun: _Begun,
        gathered: Gathered | None,
        planned: FormatPlan | None,
        counts: Gathered | None,
    ) -> Planned:
        """Step 3 (rank 0): the source's plan from the format's (``planned``, else assembled
        now) and the ranks' ``counts`` (else counted now), kept for a restart."""
        prepared = begun.prepared
        done = planned if planned is not None else self.assemble(prepared, gathered)
        here = self._through(prepared.listing.files)
        counted = None if counts is None else _joined(counts.values())
        result = finish_source(prepared, done, self.fmt, here, counted, census=self.census)
        if self.kept is not None:
            files = prepared.listing.files
            facts = self.facts
            by_path = {f.path: (f.size, f.version, x) for f, x in zip(files, facts, strict=False)}
            self.kept.save(Kept(begun.listing, result, by_path))
        return result

    def _through(self, files: Sequence[ListedFile]) -> FileSystemSpec:
        """The filesystem reading ``files`` through the node-local cache when there is one (the
        listing just told each identity: nothing to check)."""
        if self.cache is None:
            return self.fs
        return self.cache.wrap(self.fs, {f.path: (f.size, f.version) for f in files}, trusted=True)


def _joined(parts: Sequence[Counts]) -> Counts:
    """The counts of each rank's share of the chunks, in order, as one."""
    return _join(parts, 0), _join(parts, 1), _join(parts, 2)


def _join(parts: Sequence[Counts], k: int) -> list[Any] | None:
    """The ``k``-th count of every share, concatenated (``None``: not counted)."""
    if parts[0][k] is None:
        return None
    return [x for part in parts for x in (part[k] or ())]
