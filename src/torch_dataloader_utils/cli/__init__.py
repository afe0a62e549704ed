"""The ``tdu`` command line: ``tdu demo``, ``tdu plan``, ``tdu read``, ``tdu index``,
``tdu explain`` (`cli.explain`) and ``tdu cache``."""

from __future__ import annotations

import argparse
import collections
import json
import os
import shutil
import sys
import time
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

from ..errors import InvalidArgumentError, TorchDataloaderUtilsError
from ..metrics.clock import STAGES
from .explain import add_explain
from .explain import explain as explain_batch
from .profile import add_profile, profile

__all__ = ["main", "parser"]

DEMO_DIR = Path(".tdu-demo")
# Set to 1: errors print their whole traceback (as --traceback does).
DEBUG_ENV = "TDU_DEBUG"


def _progress(items: Iterable[Any], total: int | None, desc: str) -> Iterator[Any]:
    try:
        from tqdm import tqdm
    except ImportError:  # the `cli` extra is optional: fall back to a plain counter
        for i, item in enumerate(items, 1):
            if i % 50 == 0 or i == total:
                print(f"\r{desc}: {i}/{total}", end="", file=sys.stderr, flush=True)
            yield item
        print(file=sys.stderr)
        return
    yield from tqdm(items, total=total, desc=desc, unit="batch", leave=True, file=sys.stderr)


def make_demo_dataset(root: Path, rows: int, files: int = 8) -> Path:
    """Write a Parquet dataset with numeric, string, embedding and token-list columns."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    marker = root / f"_rows={rows}"
    if marker.exists():
        return root
    if root.exists() and any(root.iterdir()):
        if not any(root.glob("_rows=*")):  # not a demo dataset: never delete user files
            raise SystemExit(f"tdu demo: {root} exists and is not a demo dataset; pick --dir")
        shutil.rmtree(root)
    root.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    per = -(-rows // files)
    for f in range(files):
        ids = np.arange(f * per, min(rows, (f + 1) * per))
        n = len(ids)
        lengths = rng.integers(4, 65, n)
        offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
        columns: dict[str, Any] = {"id": pa.array(ids)}
        for j in range(8):
            columns[f"x{j}"] = pa.array(rng.standard_normal(n, dtype=np.float32))
        columns["label"] = pa.array((ids * 7919) % 10)
        columns["text"] = pa.array([f"sample-{i:012d}" for i in ids])
        columns["embedding"] = pa.FixedSizeListArray.from_arrays(
            pa.array(rng.standard_normal(n * 32, dtype=np.float32)), 32
        )
        columns["tokens"] = pa.ListArray.from_arrays(
            pa.array(offsets), pa.array(rng.integers(0, 32_000, int(offsets[-1]), dtype=np.int32))
        )
        pq.write_table(pa.table(columns), root / f"part-{f:03d}.parquet", row_group_size=16_384)
    marker.touch()  # starts with "_": the listing skips it, as it skips _SUCCESS
    return root


def _demo(args: argparse.Namespace) -> int:
    from .. import create_dataloader

    root = make_demo_dataset(Path(args.dir), args.rows)
    print(f"dataset: {root} ({args.rows:,} rows: 8 float32, label, text, 32-d embedding, tokens)")
    for workers in args.workers:
        start = time.perf_counter()
        loader = create_dataloader(
            str(root), batch_size=args.batch_size, shuffle=True, num_workers=workers
        )
        loader.set_epoch(0)
        seen: collections.Counter[int] = collections.Counter()
        first = None
        epoch_start = time.perf_counter()
        for batch in _progress(loader, len(loader), f"{workers} workers"):
            if first is None:
                first = time.perf_counter() - start
            seen.update(batch["id"].tolist())
        elapsed = time.perf_counter() - epoch_start
        rows = sum(seen.values())
        exact = rows == args.rows and len(seen) == args.rows
        print(
            f"num_workers={workers}: {rows:,} rows in {elapsed:.2f} s = {rows / elapsed:,.0f} "
            f"rows/s; first batch after {first or 0:.3f} s (planning included); "
            f"every row exactly once: {'yes' if exact else 'NO'}"
        )
        print(f"  where the time went: {time_went(loader.metrics(), elapsed)}")
        if not exact:
            return 1
    return 0


def time_went(metrics: dict[str, float], elapsed: float) -> str:
    """One line of where a pass's time went (`TabularDataLoader.metrics`)."""
    parts = [f"the loop waited {metrics['wait_s']:.2f} s of {elapsed:.2f} s for batches"]
    busy = {s: metrics[f"{s}_s"] for s in STAGES if metrics[f"{s}_s"] > 0.0005}
    if busy:
        spent = ", ".join(f"{stage} {seconds:.2f} s" for stage, seconds in busy.items())
        parts.append(f"its processes spent {spent}")
    parts.append(f"planning {metrics['planning_s']:.2f} s")
    return "; ".join(parts)


def _plan(args: argparse.Namespace) -> int:
    from .. import StructuredDataset

    dataset = StructuredDataset(args.path, args.format, partitioning=args.partitioning)
    plan = dataset.plan
    print(plan.summary())
    print(plan.schema)
    for chunk in plan.chunks[: args.limit]:
        print(f"  {chunk.path} [{chunk.start}:{chunk.stop}) rows={chunk.num_rows}")
    if len(plan.chunks) > args.limit:
        print(f"  ... {len(plan.chunks) - args.limit} more chunks")
    return 0


def _index(args: argparse.Namespace) -> int:
    from ..fs.spec import FileSystemSpec
    from ..webdataset.index import build_index, format_index, index_path

    fs = FileSystemSpec.for_path(args.shard)
    path = fs.strip(args.shard)
    out = args.out or index_path(args.shard)
    size = int(fs.request(lambda: fs.fsspec().size(path), what=fs.url(path)))
    index = build_index(
        lambda offset, n: fs.read_range(path, offset, n),
        size,
        where=fs.url(path),
        lowercase=not args.case_sensitive,
    )
    text = format_index(index)
    import fsspec

    with fsspec.open(out, "wb") as f:
        f.write(text.encode("utf-8", "surrogateescape"))
    print(f"{out}: {len(index)} samples ({fs.url(path)}, {size:,} bytes)")
    return 0


def _read(args: argparse.Namespace) -> int:
    """Read epochs of a source; per epoch: rows, rows/s and what the cache did."""
    from .. import create_dataloader

    options = json.loads(args.storage_options) if args.storage_options else None
    start = time.perf_counter()
    loader = create_dataloader(
        args.path,
        format=args.format,
        batch_size=args.batch_size,
        shuffle=True,
        num_workers=args.workers,
        storage_options=options,
        cache_dir=args.cache_dir,
        cache_limit=args.cache_limit,
    )
    print(f"planned in {time.perf_counter() - start:.2f} s: {loader.dataset.plan.summary()}")
    planning = loader.cache_stats
    if planning is not None:
        print(f"  planning: {_cache_line(planning)}")
    for epoch in range(args.epochs):
        loader.set_epoch(epoch)
        began, rows = time.perf_counter(), 0
        for batch in _progress(loader, len(loader), f"epoch {epoch}"):
            rows += len(next(iter(batch.values())))
        elapsed = time.perf_counter() - began
        line = f"epoch {epoch}: {rows:,} rows in {elapsed:.2f} s = {rows / elapsed:,.0f} rows/s"
        stats = loader.cache_epochs.get(epoch)
        print(line + (f"; {_cache_line(stats)}" if stats is not None else ""))
    return 0


def _cache_line(stats: Any) -> str:
    return (
        f"cache hits {stats.hits:,}, misses {stats.misses:,}, "
        f"{stats.bytes_from_cache / 1e6:,.1f} MB from the cache, "
        f"{stats.bytes_from_store / 1e6:,.1f} MB from the store, {stats.requests:,} requests"
        + (f", {stats.bypassed:,} not stored (full)" if stats.bypassed else "")
        + (f", {stats.evicted:,} evicted" if stats.evicted else "")
    )


def _cache(args: argparse.Namespace) -> int:
    """Show or clear a node-local cache."""
    from ..cache import CacheConfig, open_store
    from ..sources.kept import kept_plans

    config = CacheConfig.of(args.dir, None)
    if config is None:
        raise InvalidArgumentError("no cache directory: pass --dir or set TDU_CACHE_DIR")
    store = open_store(config)
    if args.action == "clear":
        before = store.summary()
        plans = kept_plans(config.directory, clear=True)
        store.clear()
        print(
            f"cleared {config.directory}: {before.ranges:,} ranges, "
            f"{before.bytes / 1e6:,.1f} MB, {plans} kept plans"
        )
        return 0
    held = store.summary()
    print(
        f"{held.directory}: {held.bytes / 1e6:,.1f} MB in {held.ranges:,} ranges of "
        f"{held.files:,} files, {held.metadata:,} metadata entries, "
        f"{kept_plans(config.directory)} kept plans"
        + (f", {held.leftovers} unfinished writes" if held.leftovers else "")
    )
    return 0


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x]


class _Help(argparse.ArgumentDefaultsHelpFormatter):
    """Shows each option's default, unless its help already says it in words or it has none
    (a required option)."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        return text if "default" in text or action.required else super()._get_help_string(action)


def parser() -> argparse.ArgumentParser:
    """The command line's parser: one subcommand per task."""
    top = argparse.ArgumentParser(
        prog="tdu",
        description="torch-dataloader-utils: plan, read and inspect sources from the shell",
        formatter_class=_Help,
    )
    trace = f"on an error, print the whole traceback, not one line (default: off; {DEBUG_ENV}=1)"
    top.add_argument("--traceback", action="store_true", help=trace)
    commands = top.add_subparsers(dest="command", required=True)

    def command(name: str, text: str) -> argparse.ArgumentParser:
        sub = commands.add_parser(name, help=text, description=text, formatter_class=_Help)
        # Also after the subcommand; SUPPRESS keeps the top-level value when not given here.
        sub.add_argument("--traceback", action="store_true", default=argparse.SUPPRESS, help=trace)
        return sub

    demo = command("demo", "generate a local dataset and load it")
    demo.add_argument("--rows", type=int, default=300_000, help="rows to write")
    demo.add_argument("--batch-size", type=int, default=1024, help="rows per batch")
    demo.add_argument(
        "--workers", type=_ints, default=[0, 2], help="worker counts to try in turn, e.g. 0,2,4"
    )
    demo.add_argument("--dir", default=str(DEMO_DIR), help="where the dataset is written")
    demo.set_defaults(run=_demo)
    plan = command("plan", "show how a source is planned into chunks")
    plan.add_argument("path", help="a path, URL, directory or glob")
    plan.add_argument("--format", default="parquet", help="the format's name")
    plan.add_argument(
        "--partitioning",
        default=None,
        help='"hive" adds key=value directory columns (default: none)',
    )
    plan.add_argument("--limit", type=int, default=20, help="chunks to list")
    plan.set_defaults(run=_plan)
    index = command(
        "index", "write a WebDataset shard's DALI index (v1.2), byte-compatible with wds2idx"
    )
    index.add_argument("shard", help="the .tar shard (local path or URL)")
    index.add_argument("out", nargs="?", default=None, help="default: the shard's sibling .idx")
    index.add_argument(
        "--case-sensitive",
        action="store_true",
        help="extensions differing in case are distinct (checked for repeats; written as is)",
    )
    index.set_defaults(run=_index)
    read = command("read", "read epochs of a source: throughput and, with a cache, what it did")
    read.add_argument("path", help="a path, URL, directory or glob")
    read.add_argument("--format", default="parquet", help="the format's name")
    read.add_argument("--epochs", type=int, default=2, help="epochs to read")
    read.add_argument("--batch-size", type=int, default=1024, help="rows per batch")
    read.add_argument("--workers", type=int, default=2, help="DataLoader worker processes")
    read.add_argument(
        "--storage-options",
        default=None,
        help="JSON, e.g. '{\"anon\": true}' (default: none)",
    )
    read.add_argument("--cache-dir", default=None, help="default: $TDU_CACHE_DIR, else no cache")
    read.add_argument(
        "--cache-limit",
        default=None,
        help="bytes or e.g. 50GB (default: $TDU_CACHE_LIMIT, else what the disk holds)",
    )
    read.set_defaults(run=_read)
    explain = command(
        "explain", "print one batch's rows (files and row numbers), from the plan, read on demand"
    )
    add_explain(explain)
    explain.set_defaults(run=explain_batch)
    profiling = command(
        "profile", "run the loader per worker count: where the time goes, and the advice"
    )
    add_profile(profiling)
    profiling.set_defaults(run=profile)
    cache = command("cache", "show or clear a node-local cache")
    cache.add_argument(
        "action", nargs="?", choices=["show", "clear"], default="show", help="what to do"
    )
    cache.add_argument("--dir", default=None, help="the cache_dir (default: $TDU_CACHE_DIR)")
    cache.set_defaults(run=_cache)
    return top


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the exit status (2: a mistake, named in one line)."""
    args = parser().parse_args(argv)
    try:
        status: int = args.run(args)
    except (TorchDataloaderUtilsError, OSError, json.JSONDecodeError) as exc:
        # An ordinary mistake (a missing path, an unknown format, bad JSON) is one line, as
        # argparse's own errors are; the traceback is for bugs, on request.
        if args.traceback or os.environ.get(DEBUG_ENV, "") not in ("", "0"):
            raise
        message = " ".join(_last_words(str(exc)).split()) or type(exc).__name__
        print(f"tdu {args.command}: {message}", file=sys.stderr)
        return 2
    return status


def _last_words(text: str) -> str:
    """The error itself: a worker's error re-raised by torch carries the worker's traceback
    ("Caught X in DataLoader worker process N. Original Traceback ..."), whose last line is
    the error."""
    if "Original Traceback" not in text:
        return text
    lines = [line for line in text.strip().splitlines() if line.strip()]
    if not lines:
        return text
    kind, _, message = lines[-1].partition(": ")  # "package.module.SomeError: message"
    return message if message and kind.rsplit(".", 1)[-1].isidentifier() else lines[-1]
