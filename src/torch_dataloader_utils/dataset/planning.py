"""How a dataset plans one source, and the format it is read with: the files of a path
(listed, footers read, a share on each rank, the plan kept in the cache) or a table (its
kind's planning on rank 0, `dataset.tables`). The one place that tells the two apart
(`table_kind_of`)."""

from __future__ import annotations

import os
from typing import Any

from ..cache import ReadCache
from ..errors import InvalidArgumentError
from ..formats import Format, get_format
from ..fs import FileSystemSpec
from ..options import Options, Source
from ..sources.broadcast import Spread
from ..sources.census import Census
from ..sources.files import Planned
from ..sources.kept import KeptPlans
from ..sources.steps import plan_files
from .tables import plan_table, table_format, table_kind_of

__all__ = ["counting", "format_of", "plan"]


def format_of(source: Source) -> Format:
    """The format ``source`` is read with (on every rank)."""
    if table_kind_of(source) is not None:
        return table_format(source)
    return get_format(source.format, source.format_options)


def plan(
    source: Source,
    fmt: Format,
    fs: FileSystemSpec,
    spread: Spread,
    *,
    options: Options,
    cache: ReadCache | None,
) -> Planned:
    """Plan ``source`` on the ranks of ``spread``: a table on rank 0; files listed and their
    footers read (a share on each rank), filtered rows counted, from the plan kept in
    ``cache`` when the listing is unchanged (`sources.steps`), its reads through it."""
    count = counting(options)
    derive = source.derive
    census = None if derive is None else Census(derive, census_folders(options, fs, cache))
    if table_kind_of(source) is not None:
        return spread.from_rank0(lambda: plan_table(source, fs, census=census, **count))
    assert source.path is not None
    if source.version is not None or source.as_of is not None:
        raise InvalidArgumentError(
            f"{source.label}: version= and as_of= select a version of a table (format="
            f'"delta", "lance", or an Iceberg table=); files of format {source.format!r} have '
            'none (a Hugging Face Hub path takes its revision in the path: "hf://datasets/'
            'org/name@v1.0/...")'
        )
    asked = {
        "columns": source.columns,
        "filters": source.filters,
        "partitioning": source.partitioning,
        "split_bytes": source.split_bytes,
        "split_rows": source.split_rows,
        **count,
    }
    kept = None
    if cache is not None:  # (what changes the plan keys it)
        given = {**asked, "filters": None if source.filters is None else str(source.filters)}
        if derive is not None:
            given["derive"] = derive.identity
        kept = KeptPlans.of(cache.config.directory, fmt, fs.protocol, source.path, given)
    if census is not None:
        asked["census"] = census
    return plan_files(source.path, fmt, fs, spread=spread, kept=kept, cache=cache, **asked)


def census_folders(
    options: Options, fs: FileSystemSpec, cache: ReadCache | None
) -> tuple[tuple[FileSystemSpec, str], ...]:
    """Where a census's counts are kept: the node-local cache's folder and ``census_dir``
    (read with the source's storage options when on the same store)."""
    folders = []
    if cache is not None:
        folders.append((FileSystemSpec("file"), os.fspath(cache.config.directory)))
    if options.census_dir is not None:
        where = os.fspath(options.census_dir)
        shared = FileSystemSpec.for_path(where)
        if shared.protocol == fs.protocol:
            shared = fs
        folders.append((shared, where))
    return tuple(folders)


def counting(options: Options) -> dict[str, Any]:
    """What planning a source also counts, as keywords of `plan_files` and `plan_table`: a
    packed dataset's tokens (its order is one of tokens), with an EOS token's one per
    document; a token budget's every row's length; nothing for another dataset."""
    count: dict[str, Any] = {}
    packing, budget = options.packing, options.batching
    if packing is not None:
        count.update(tokens=packing.column, eos=packing.eos_token is not None)
        if packing.balance is not None:  # its costs: each document's length (docs/adr/0032)
            count.update(lengths=packing.column)
    if budget is not None:
        count.update(lengths=budget.column)
    return count
