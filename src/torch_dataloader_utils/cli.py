"""The ``tdu`` command line: ``tdu demo``, ``tdu plan``, ``tdu read``, ``tdu index`` and
``tdu cache``."""

from __future__ import annotations

import argparse
import collections
import shutil
import sys
import time
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

__all__ = ["main"]

DEMO_DIR = Path(".tdu-demo")


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
    from . import create_dataloader

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
        if not exact:
            return 1
    return 0


def _plan(args: argparse.Namespace) -> int:
    from . import StructuredDataset

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
    from .errors import TorchDataloaderUtilsError
    from .fs.spec import FileSystemSpec
    from .webdataset.index import build_index, format_index, index_path

    fs = FileSystemSpec.for_path(args.shard)
    path = fs.strip(args.shard)
    out = args.out or index_path(args.shard)
    try:
        size = int(fs.request(lambda: fs.fsspec().size(path), what=fs.url(path)))
        index = build_index(
            lambda offset, n: fs.read_range(path, offset, n),
            size,
            where=fs.url(path),
            lowercase=not args.case_sensitive,
        )
        text = format_index(index)
    except (TorchDataloaderUtilsError, OSError) as exc:
        print(f"tdu index: {exc}", file=sys.stderr)
        return 1
    import fsspec

    with fsspec.open(out, "wb") as f:
        f.write(text.encode("utf-8", "surrogateescape"))
    print(f"{out}: {len(index)} samples ({fs.url(path)}, {size:,} bytes)")
    return 0


def _read(args: argparse.Namespace) -> int:
    """Read epochs of a source; per epoch: rows, rows/s and what the cache did."""
    import json

    from . import create_dataloader

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
    from .cache import CacheConfig, open_store

    config = CacheConfig.of(args.dir, None)
    if config is None:
        print("tdu cache: no cache directory: pass --dir or set TDU_CACHE_DIR", file=sys.stderr)
        return 2
    store = open_store(config)
    if args.action == "clear":
        before = store.summary()
        store.clear()
        print(f"cleared {config.directory}: {before.ranges:,} ranges, {before.bytes / 1e6:,.1f} MB")
        return 0
    held = store.summary()
    print(
        f"{held.directory}: {held.bytes / 1e6:,.1f} MB in {held.ranges:,} ranges of "
        f"{held.files:,} files, {held.metadata:,} metadata entries"
        + (f", {held.leftovers} unfinished writes" if held.leftovers else "")
    )
    return 0


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x]


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the exit status."""
    parser = argparse.ArgumentParser(prog="tdu", description="torch-dataloader-utils")
    commands = parser.add_subparsers(dest="command", required=True)
    demo = commands.add_parser("demo", help="generate a local dataset and load it")
    demo.add_argument("--rows", type=int, default=300_000)
    demo.add_argument("--batch-size", type=int, default=1024)
    demo.add_argument("--workers", type=_ints, default=[0, 2], help="e.g. 0,2")
    demo.add_argument("--dir", default=str(DEMO_DIR))
    demo.set_defaults(run=_demo)
    plan = commands.add_parser("plan", help="show how a source is planned into chunks")
    plan.add_argument("path")
    plan.add_argument("--format", default="parquet")
    plan.add_argument("--partitioning", default=None)
    plan.add_argument("--limit", type=int, default=20)
    plan.set_defaults(run=_plan)
    index = commands.add_parser(
        "index", help="write a WebDataset shard's DALI index (v1.2), byte-compatible with wds2idx"
    )
    index.add_argument("shard", help="the .tar shard (local path or URL)")
    index.add_argument("out", nargs="?", default=None, help="default: the shard's sibling .idx")
    index.add_argument(
        "--case-sensitive",
        action="store_true",
        help="extensions differing in case are distinct (checked for repeats; written as is)",
    )
    index.set_defaults(run=_index)
    read = commands.add_parser(
        "read", help="read epochs of a source: throughput and, with a cache, what it did"
    )
    read.add_argument("path", help="a path, URL, directory or glob")
    read.add_argument("--format", default="parquet")
    read.add_argument("--epochs", type=int, default=2)
    read.add_argument("--batch-size", type=int, default=1024)
    read.add_argument("--workers", type=int, default=2)
    read.add_argument("--storage-options", default=None, help="JSON, e.g. '{\"anon\": true}'")
    read.add_argument("--cache-dir", default=None, help="default: $TDU_CACHE_DIR")
    read.add_argument("--cache-limit", default=None, help="bytes or e.g. 50GB")
    read.set_defaults(run=_read)
    cache = commands.add_parser("cache", help="show or clear a node-local cache")
    cache.add_argument("action", nargs="?", choices=["show", "clear"], default="show")
    cache.add_argument("--dir", default=None, help="the cache_dir (default: $TDU_CACHE_DIR)")
    cache.set_defaults(run=_cache)
    args = parser.parse_args(argv)
    status: int = args.run(args)
    return status


if __name__ == "__main__":
    raise SystemExit(main())
