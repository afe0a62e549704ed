"""Parquet planning: every file's footer read once (`facts`), in threads where that helps,
into chunks of consecutive row groups and the plan's schema."""

from __future__ import annotations

import sys
import time
from collections.abc import Sequence

from ...fs import FileSystemSpec, ListedFile
from ...fs.progress import Progress
from ...fs.threads import PLAN_THREADS
from ...planning import Chunk
from ..base import FormatPlan, Listing, Partition, ReadOptions
from ..chunking import group_units, unit_chunks
from ..names import warn_renamed
from ..opening import each_file
from ..schemas import FileSchema, check_schemas
from .facts import FileFacts, read_facts
from .leafless import read_options
from .tokens import Told, chunk_tokens

__all__ = ["assemble", "read_all"]

# Why these values, with the numbers measured: docs/adr/0019-format-measurements.md.
# Local files read at a time, at most (progress is counted a task at a time; the first tells
# whether their reads wait, and threads read the rest).
_TASK_FILES = 256
# Local planning goes on in threads when the first task spent this share of its wall time waiting.
_LOCAL_WAITING = 0.5
# Remote footers are read through pyarrow's C++ reader from this many files a share on
# (`facts._native_footer`): it saves about 3 ms of CPU a file, and importing pyarrow.dataset
# costs 0.5 s once (docs/adr/0024-planning-at-scale.md#footers-read-natively).
_NATIVE_FILES = 128


def assemble(
    listing: Listing, facts: Sequence[FileFacts], fs: FileSystemSpec, options: ReadOptions
) -> FormatPlan:
    """The plan of ``listing`` from its footers' facts (`read_all`): chunks of row groups."""
    files = listing.files
    for f, fact in zip(files, facts, strict=True):
        if fact.renamed is not None:
            # (one frame deeper than ParquetFormat.plan, which warned with stacklevel=3)
            warn_renamed(fs.url(f.path), fact.renamed, stacklevel=4)
    schema = check_schemas(*_distinct_schemas(files, facts), fs, options)
    told: list[Told | None] | None = []
    if options.tokens is None or options.filter is not None:
        told = None  # (a filter changes which rows count: `FormatPlan.token_counts`)
    if told is None and options.split_rows is None and options.split_bytes is None:
        # A chunk a row group, built as columns: a million row groups make no `Chunk` object.
        kept = [[(rg, n, size) for rg, n, size, _ in f.row_groups] for f in facts]
        rows = sum(r[1] for f in facts for r in f.row_groups)
        uncompressed = sum(r[3] for f in facts for r in f.row_groups)
        return FormatPlan(
            chunks=unit_chunks(listing, kept),
            schema=schema,
            row_bytes=max(uncompressed / rows if rows else 1.0, 1.0),
            read_options=read_options(options, schema),
        )
    chunks: list[Chunk] = []
    rows = uncompressed = 0
    for f, fact, partition in zip(files, facts, listing.partitions, strict=True):
        units = [(rg, n, size) for rg, n, size, _ in fact.row_groups]
        made = group_units(f.path, units, partition, options)
        chunks.extend(made)
        if told is not None:
            groups = {
                r[0]: (r[1], t) for r, t in zip(fact.row_groups, fact.tokens or (), strict=False)
            }
            told.extend(chunk_tokens(c.start, c.stop, c.num_rows, groups) for c in made)
        for r in fact.row_groups:
            rows += r[1]
            uncompressed += r[3]
    row_bytes = uncompressed / rows if rows else 1.0
    return FormatPlan(
        chunks=chunks,
        schema=schema,
        row_bytes=max(row_bytes, 1.0),
        read_options=read_options(options, schema),
        token_counts=told,
    )


def read_all(listing: Listing, fs: FileSystemSpec, options: ReadOptions) -> list[FileFacts]:
    """The facts of each listed file, in order: local files' in this thread, unless the first
    task of files (up to `_TASK_FILES`) spent its time waiting; otherwise each in the next
    free planning thread (`opening.each_file`)."""
    pairs = list(zip(listing.files, listing.partitions, strict=True))
    progress = Progress("Parquet footers read", len(pairs))
    native = None
    if len(pairs) >= _NATIVE_FILES or "pyarrow.dataset" in sys.modules:
        native = fs.native_reads()

    def read(task: Sequence[tuple[ListedFile, Partition]]) -> list[FileFacts]:
        found = [read_facts(*pair, fs, options, native=native) for pair in task]
        progress.add(len(found))
        return found

    facts: list[FileFacts] = []
    rest = pairs
    if fs.is_local and pairs:
        # A local footer walk holds the GIL, so threads only take turns: the rest of the files
        # are read here too (a task at a time, for the progress) unless the first task spent
        # its time waiting (a network mount, a cold disk).
        task = max(1, min(_TASK_FILES, len(pairs) // (PLAN_THREADS * 4)))
        wall, cpu = time.perf_counter(), time.thread_time()
        facts.extend(read(pairs[:task]))
        wall, cpu = time.perf_counter() - wall, time.thread_time() - cpu
        rest = pairs[task:]
        if wall - cpu < _LOCAL_WAITING * wall:
            for start in range(0, len(rest), task):
                facts.extend(read(rest[start : start + task]))
            rest = []
    if rest:  # on an error, the files not taken yet are not read
        facts.extend(each_file(lambda pair: read([pair])[0], rest))
    progress.finish()
    return facts


def _distinct_schemas(
    files: Sequence[ListedFile], facts: Sequence[FileFacts]
) -> tuple[list[ListedFile], list[FileSchema]]:
    """The files to check the schemas of: the first with each schema (files that share a footer
    schema share the object, `facts._arrow_schema`), once with rows and once without.

    `check_schemas` reports the same outcome on these as on all the files, naming the same
    files: it reports the first file of the kind it looks for, and each kind's first file is
    kept (so is the first file, which its messages name).
    """
    seen: set[tuple[int, bool]] = set()
    kept_files: list[ListedFile] = []
    kept: list[FileSchema] = []
    for f, fact in zip(files, facts, strict=True):
        key = (id(fact.schema), bool(fact.row_groups))
        if key not in seen:
            seen.add(key)
            kept_files.append(f)
            kept.append(FileSchema(fact.schema, key[1]))
    return kept_files, kept
