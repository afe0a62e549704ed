"""Remote read speed against a real S3 server (SeaweedFS on loopback), measured in one run.

Starts SeaweedFS (the test suite's own tooling), uploads a tabular Parquet dataset once, then
reads every file completely (all columns, decoded to Arrow) with:

- ``plain``: ``pyarrow.parquet`` over s3fs file objects, one file after another (what a naive
  loader does: reads are serialised through the file object);
- ``raw pyarrow``: ``ParquetFile(...).iter_batches()`` over pyarrow's native S3 filesystem, one
  file after another (pre-buffered, parallel column-chunk requests): the reference;
- ours: ``create_dataloader(..., output_format="arrow")`` with ``storage_backend`` ``arrow``
  and ``fsspec``, in-process and with 2 workers, and with 2 workers and torch output (the
  packed transport).

MB/s are compressed bytes on the server per second of wall time (each configuration's best of
``--repeat`` runs); ratios are against raw pyarrow in the same run.

``--cache``: the node-local cache (``cache_dir=``) instead, every request delayed by
``--latency-ms`` (default 20) through the test suite's proxy. Three sections:

1. the limit: raw ``ParquetFile(local).iter_batches()`` over a local copy of the same files, one
   process (best of ``--repeat``);
2. epochs 1 and 2 of ``create_dataloader(..., shuffle=True, batch_size=4096)`` (torch output,
   ``persistent_workers=False``) for each of ``--workers``, without a cache and with a fresh
   ``cache_dir``: rows/s, ratio to the limit, requests through the proxy, and per cached epoch
   ``loader.cache_epochs[e]``. Every epoch must read every ``id`` exactly once and a cached
   epoch 2 must make no request, else the script exits non-zero;
3. planning (``create_dataloader`` construction) over ``--small-files`` small Parquet files
   behind the same proxy: without a cache, with a fresh cache (cold), and again with the same
   cache (warm), each with the requests it made; warm must make only listing requests.

Epoch times run from ``iter(loader)`` to the last batch (worker start-up included). MB/s are the
dataset's compressed bytes per second, wherever they were read from.

Usage::

    python benchmarks/remote_read.py                 # 1M rows (~340 MB in 8 files)
    python benchmarks/remote_read.py --rows 200000   # smaller
    python benchmarks/remote_read.py --cache         # the cache: 400k rows, 2,000 small files
    python benchmarks/remote_read.py --cache --rows 100000 --small-files 200   # quick
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import numpy as np
import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # the test suite's server tooling

os.environ.setdefault("AWS_EC2_METADATA_DISABLED", "true")

from tests.services.proxy import FaultProxy  # noqa: E402
from tests.services.seaweedfs import SeaweedFS, start_seaweedfs  # noqa: E402

import torch_dataloader_utils as tdu  # noqa: E402

BUCKET = "bench"
DATA = f"{BUCKET}/data"
SMALL = f"{BUCKET}/small"


def make_table(rows: int, seed: int) -> pa.Table:
    """8 float32, an int, a 20-char string, a 64-float embedding (as benchmarks/throughput.py)."""
    rng = np.random.default_rng(seed)
    cols: dict[str, pa.Array] = {"id": pa.array(np.arange(seed * rows, (seed + 1) * rows))}
    for j in range(8):
        cols[f"f{j}"] = pa.array(rng.random(rows, dtype=np.float32))
    cols["i1"] = pa.array(rng.integers(0, 1000, rows))
    cols["s"] = pa.array([f"{i:020d}" for i in range(rows)])
    emb = pa.array(rng.random(rows * 64, dtype=np.float32))
    cols["emb"] = pa.FixedSizeListArray.from_arrays(emb, 64)
    return pa.table(cols)


def upload(s3: pafs.S3FileSystem, rows: int, files: int, row_group: int) -> list[str]:
    paths = []
    per = rows // files
    for f in range(files):
        path = f"{DATA}/part-{f:03d}.parquet"
        with s3.open_output_stream(path) as out:
            pq.write_table(make_table(per, f), out, row_group_size=row_group)
        paths.append(path)
    return paths


def timed(run: Callable[[], int]) -> tuple[float, int]:
    start = time.perf_counter()
    rows = run()
    return time.perf_counter() - start, rows


def start_server(stack: contextlib.ExitStack, tmp: str) -> SeaweedFS:
    """SeaweedFS with the bucket made, stopped when ``stack`` closes."""
    server = start_seaweedfs(Path(tmp), access_key="bench", secret_key="bench-secret")
    stack.callback(server.stop)
    server.create_bucket(BUCKET)
    return server


def slow_proxy(stack: contextlib.ExitStack, server: SeaweedFS, latency_ms: float) -> FaultProxy:
    """The test suite's proxy in front of ``server``, delaying every request; stopped when
    ``stack`` closes."""
    proxy = FaultProxy(("127.0.0.1", server.s3_port), slow_rate=1.0, delay=latency_ms / 1000)
    stack.callback(proxy.stop)
    return proxy


def native_fs(server: SeaweedFS, endpoint: str) -> pafs.S3FileSystem:
    """pyarrow's S3 filesystem on ``server`` through ``endpoint`` (a proxy's, or its own)."""
    return pafs.S3FileSystem(
        **{**server.pyarrow_options(), "endpoint_override": endpoint.split("//")[1]}
    )


def table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> None:
    """A Markdown table: the first column left-aligned, the others right."""
    print("| " + " | ".join(header) + " |")
    print("|:--|" + "--:|" * (len(header) - 1))
    for row in rows:
        print("| " + " | ".join(row) + " |")
    print()


# --- default mode: readers against raw pyarrow --------------------------------------------------


def run_reads(args: argparse.Namespace) -> None:
    with (
        tempfile.TemporaryDirectory(prefix="tdu-remote-bench-") as tmp,
        contextlib.ExitStack() as stack,
    ):
        server = start_server(stack, tmp)
        native = pafs.S3FileSystem(**server.pyarrow_options())
        paths = upload(native, args.rows, args.files, args.row_group)
        nbytes = sum(native.get_file_info(p).size for p in paths)
        endpoint = server.endpoint_url
        if args.latency_ms:
            endpoint = slow_proxy(stack, server, args.latency_ms).endpoint_url
            native = native_fs(server, endpoint)
        options = server.s3fs_options(endpoint_url=endpoint)
        import s3fs

        fsspec_fs = s3fs.S3FileSystem(**options)

        def plain() -> int:
            rows = 0
            for p in paths:
                with fsspec_fs.open(p, "rb") as f:
                    for batch in pq.ParquetFile(f).iter_batches(batch_size=65_536):
                        rows += batch.num_rows
            return rows

        def raw() -> int:
            rows = 0
            for p in paths:
                with native.open_input_file(p) as f:
                    for batch in pq.ParquetFile(f).iter_batches(batch_size=65_536):
                        rows += batch.num_rows
            return rows

        def ours(backend: str, workers: int, output: str = "arrow") -> Callable[[], int]:
            loader = tdu.create_dataloader(
                f"s3://{DATA}/",
                batch_size=4096,
                output_format=output,
                storage_options=options,
                storage_backend=backend,
                num_workers=workers,
                persistent_workers=workers > 0,
            )

            def run() -> int:
                if output == "arrow":
                    return sum(batch.num_rows for batch in loader)
                return sum(len(batch["id"]) for batch in loader)

            return run

        print(
            f"SeaweedFS on loopback, {args.rows:,} rows in {args.files} files, "
            f"{nbytes / 1e6:.0f} MB, row groups of {args.row_group:,} rows"
            + (f", {args.latency_ms:g} ms added per request" if args.latency_ms else "")
        )
        runs: list[tuple[str, Callable[[], int]]] = [
            ("raw pyarrow (native S3)", raw),
            ("plain (pyarrow over s3fs files)", plain),
            ("ours, arrow backend, in-process", ours("arrow", 0)),
            ("ours, fsspec backend, in-process", ours("fsspec", 0)),
            ("ours, arrow backend, 2 workers", ours("arrow", 2)),
            ("ours, fsspec backend, 2 workers", ours("fsspec", 2)),
            # Tensors cross from workers in one shared buffer per bundle; Arrow batches
            # are pickled, which costs more than the read on this 2-core machine.
            ("ours, arrow backend, 2 workers, torch", ours("arrow", 2, "torch")),
        ]
        # Configurations take turns, so a burst of load on the machine hits all of them.
        best = dict.fromkeys((name for name, _ in runs), float("inf"))
        expected = args.rows // args.files * args.files
        for _ in range(args.repeat):
            for name, run in runs:
                seconds, rows = timed(run)
                if rows != expected:
                    raise SystemExit(f"{name}: read {rows} rows, expected {expected}")
                best[name] = min(best[name], seconds)
        results = {name: nbytes / seconds / 1e6 for name, seconds in best.items()}
        reference = results["raw pyarrow (native S3)"]
        print(f"{'configuration':<40} {'MB/s':>8} {'x raw':>7}")
        for name, rate in results.items():
            print(f"{name:<40} {rate:8.0f} {rate / reference:7.2f}")


# --- --cache: the node-local cache ------------------------------------------------------------


@dataclass(frozen=True)
class Limit:
    """Raw pyarrow over the local copy: the most a reader of these files can do here."""

    seconds: float
    rows: int
    nbytes: int

    @property
    def rows_per_s(self) -> float:
        return self.rows / self.seconds


@dataclass(frozen=True)
class Epoch:
    """One epoch of a loader (or, ``epoch`` None, its construction: planning): its time, whether
    every id came once, what it asked the store."""

    workers: int
    cached: bool
    epoch: int | None
    seconds: float
    rows: int
    verdict: str
    exact: bool
    requests: int
    kinds: Counter[str]
    cache: tdu.CacheStats | None


def download(native: pafs.S3FileSystem, paths: Sequence[str], dest: Path) -> list[Path]:
    """A local copy of ``paths`` (read directly from the server, not through the proxy)."""
    dest.mkdir(parents=True, exist_ok=True)
    local = []
    for path in paths:
        target = dest / Path(path).name
        with native.open_input_stream(path) as src:
            target.write_bytes(src.read())
        local.append(target)
    return local


def read_local(paths: Sequence[Path]) -> int:
    rows = 0
    for path in paths:
        for batch in pq.ParquetFile(path).iter_batches(batch_size=65_536):
            rows += batch.num_rows
    return rows


def measure_limit(paths: Sequence[Path], repeat: int) -> Limit:
    seconds, rows = min(timed(lambda: read_local(paths)) for _ in range(max(1, repeat)))
    return Limit(seconds, rows, sum(p.stat().st_size for p in paths))


def request_kinds(events: Sequence[tuple[str, str, str]]) -> Counter[str]:
    """Requests through the proxy by kind: ``list`` (ListObjects), ``GET``, ``HEAD``, ..."""
    kinds: Counter[str] = Counter()
    for method, target, _ in events:
        query = parse_qs(urlsplit(target).query, keep_blank_values=True)
        listing = method == "GET" and ("list-type" in query or "prefix" in query)
        kinds["list" if listing else method] += 1
    return kinds


def describe_kinds(kinds: Counter[str]) -> str:
    return ", ".join(f"{kind} {n:,}" for kind, n in sorted(kinds.items())) or "-"


def exactly_once(ids: np.ndarray, total: int) -> tuple[bool, str]:
    """Whether ``ids`` hold every id of ``range(total)`` exactly once."""
    counts = np.bincount(ids, minlength=total) if ids.size else np.zeros(total, np.int64)
    if ids.size and (ids.min() < 0 or counts.size > total):
        return False, f"ids out of range [0, {total:,})"
    missing, extra = int((counts == 0).sum()), int(np.maximum(counts - 1, 0).sum())
    if not missing and not extra:
        return True, "every id once"
    return False, f"NOT exactly once: {missing:,} missing, {extra:,} repeated"


def read_epoch(loader: Any) -> tuple[float, np.ndarray]:
    """Seconds from ``iter`` to the last batch, and every id read."""
    ids: list[np.ndarray] = []
    start = time.perf_counter()
    for batch in loader:
        ids.append(np.asarray(batch["id"]).copy())
    seconds = time.perf_counter() - start
    return seconds, np.concatenate(ids) if ids else np.zeros(0, np.int64)


def run_epochs(
    loader: Any, proxy: FaultProxy, *, workers: int, cached: bool, total: int, epochs: int
) -> list[Epoch]:
    """``epochs`` epochs of ``loader``, each counted at the proxy on its own."""
    out = []
    for epoch in range(epochs):
        loader.set_epoch(epoch)
        proxy.reset_counts()
        seconds, ids = read_epoch(loader)
        requests, events = proxy.counts["requests"], list(proxy.events)
        exact, verdict = exactly_once(ids, total)
        stats = loader.cache_epochs.get(epoch) if cached else None
        out.append(
            Epoch(
                workers=workers,
                cached=cached,
                epoch=epoch,
                seconds=seconds,
                rows=int(ids.size),
                verdict=verdict,
                exact=exact,
                requests=requests,
                kinds=request_kinds(events),
                cache=stats,
            )
        )
        if cached and epoch > 0 and requests:
            how = f"{workers} workers" if workers else "in-process"
            show_requests(f"{how}, cached epoch {epoch + 1}", events)
    return out


def show_requests(what: str, events: Sequence[tuple[str, str, str]]) -> None:
    """The requests a run should not have made, by method and path (query left out)."""
    paths = Counter((method, urlsplit(target).path) for method, target, _ in events)
    print(f"!! {what}: {len(events):,} requests through the proxy:")
    for (method, path), n in paths.most_common(20):
        print(f"!!   {n:5,} x {method} {path}")


def measure_epochs(
    args: argparse.Namespace, proxy: FaultProxy, options: dict[str, Any], cache_root: Path
) -> list[Epoch]:
    """Epochs 1 and 2 for each of ``--workers``, without a cache and with a fresh one."""
    total = args.rows // args.files * args.files
    results: list[Epoch] = []
    for workers in args.workers:
        for cached in (False, True):
            what = f"{workers} workers" if workers else "in-process"
            print(f"... {what}, {'cache' if cached else 'no cache'}", file=sys.stderr, flush=True)
            cache_dir = cache_root / f"epochs-{workers}" if cached else None
            proxy.reset_counts()
            start = time.perf_counter()
            loader = tdu.create_dataloader(
                f"s3://{DATA}/",
                batch_size=4096,
                shuffle=True,
                storage_options=options,
                num_workers=workers,
                persistent_workers=False,
                cache_dir=str(cache_dir) if cache_dir else None,
            )
            seconds = time.perf_counter() - start
            requests, kinds = proxy.counts["requests"], request_kinds(list(proxy.events))
            results.append(
                Epoch(
                    workers=workers,
                    cached=cached,
                    epoch=None,
                    seconds=seconds,
                    rows=0,
                    verdict="-",
                    exact=True,
                    requests=requests,
                    kinds=kinds,
                    cache=loader.cache_stats,
                )
            )
            results += run_epochs(
                loader, proxy, workers=workers, cached=cached, total=total, epochs=2
            )
            del loader
    return results


def upload_small(native: pafs.S3FileSystem, files: int, rows: int) -> None:
    """``files`` Parquet files of ``rows`` rows (``id``, ``x``), as benchmarks/scale.py."""

    def put(i: int) -> None:
        small = pa.table(
            {
                "id": pa.array(np.arange(i * rows, (i + 1) * rows, dtype=np.int64)),
                "x": pa.array(np.ones(rows, np.float32)),
            }
        )
        with native.open_output_stream(f"{SMALL}/part-{i:06d}.parquet") as out:
            pq.write_table(small, out)

    with ThreadPoolExecutor(8) as pool:
        list(pool.map(put, range(files)))


@dataclass(frozen=True)
class Planning:
    name: str
    seconds: float
    requests: int
    kinds: Counter[str]
    cache: tdu.CacheStats | None


def plan_once(
    name: str, proxy: FaultProxy, options: dict[str, Any], cache_dir: Path | None
) -> Planning:
    """Time ``create_dataloader`` over the small files, and count its requests."""
    proxy.reset_counts()
    start = time.perf_counter()
    loader = tdu.create_dataloader(
        f"s3://{SMALL}/",
        batch_size=4096,
        shuffle=True,
        storage_options=options,
        cache_dir=str(cache_dir) if cache_dir else None,
    )
    seconds = time.perf_counter() - start
    requests, events = proxy.counts["requests"], list(proxy.events)
    return Planning(name, seconds, requests, request_kinds(events), loader.cache_stats)


def measure_planning(
    proxy: FaultProxy, options: dict[str, Any], cache_root: Path
) -> list[Planning]:
    cache_dir = cache_root / "planning"
    return [
        plan_once("no cache", proxy, options, None),
        plan_once("fresh cache (cold)", proxy, options, cache_dir),
        plan_once("same cache again (warm)", proxy, options, cache_dir),
    ]


def mb(nbytes: float) -> str:
    return f"{nbytes / 1e6:,.1f}"


def print_limit(limit: Limit) -> None:
    print("## The limit: raw pyarrow over a local copy, one process (best of --repeat)\n")
    table(
        ["reader", "seconds", "rows/s", "MB/s"],
        [
            [
                "ParquetFile(local).iter_batches(), every file",
                f"{limit.seconds:.2f}",
                f"{limit.rows_per_s:,.0f}",
                f"{limit.nbytes / limit.seconds / 1e6:,.0f}",
            ]
        ],
    )


def print_epochs(results: Sequence[Epoch], limit: Limit, latency_ms: float) -> None:
    print(
        f"## Epochs through the proxy ({latency_ms:g} ms per request), shuffle on, batch 4096, "
        "torch output\n"
    )
    rows = []
    for r in results:
        s, epoch = r.cache, r.epoch is not None
        rows.append(
            [
                f"{r.workers} workers" if r.workers else "in-process",
                "fresh cache_dir" if r.cached else "none",
                "planning" if r.epoch is None else str(r.epoch + 1),
                f"{r.seconds:.2f}",
                f"{r.rows / r.seconds:,.0f}" if epoch else "-",
                f"{limit.nbytes / r.seconds / 1e6:,.0f}" if epoch else "-",
                f"{r.rows / r.seconds / limit.rows_per_s:.2f}" if epoch else "-",
                f"{r.requests:,}",
                describe_kinds(r.kinds),
                "-" if s is None else f"{s.hits:,}",
                "-" if s is None else f"{s.misses:,}",
                "-" if s is None else mb(s.bytes_from_store),
                "-" if s is None else f"{s.requests:,}",
                r.verdict,
            ]
        )
    table(
        [
            "loader", "cache", "epoch", "seconds", "rows/s", "MB/s", "x limit",
            "proxy requests", "by kind", "hits", "misses", "MB from store", "cache requests",
            "rows",
        ],
        rows,
    )  # fmt: skip


def print_planning(results: Sequence[Planning], files: int, rows: int, latency_ms: float) -> None:
    print(
        f"## Planning {files:,} remote Parquet files of {rows} rows "
        f"({latency_ms:g} ms per request): create_dataloader construction\n"
    )
    table(
        ["planning", "seconds", "proxy requests", "by kind", "hits", "misses", "MB from store"],
        [
            [
                p.name,
                f"{p.seconds:.2f}",
                f"{p.requests:,}",
                describe_kinds(p.kinds),
                "-" if p.cache is None else f"{p.cache.hits:,}",
                "-" if p.cache is None else f"{p.cache.misses:,}",
                "-" if p.cache is None else mb(p.cache.bytes_from_store),
            ]
            for p in results
        ],
    )


def failures(epochs: Sequence[Epoch], planning: Sequence[Planning]) -> list[str]:
    """What the checks found wrong (empty: all good)."""
    out = []
    for e in epochs:
        if e.epoch is None:
            continue  # planning
        how = f"{e.workers} workers" if e.workers else "in-process"
        what = f"{how}, {'cached' if e.cached else 'uncached'} epoch {e.epoch + 1}"
        if not e.exact:
            out.append(f"{what}: {e.verdict}")
        if e.cached and e.epoch and e.requests:
            out.append(f"{what}: {e.requests:,} requests to the store ({describe_kinds(e.kinds)})")
    warm = planning[-1]
    if set(warm.kinds) - {"list"}:
        out.append(f"warm planning made other requests than listing: {describe_kinds(warm.kinds)}")
    return out


def load() -> str:
    return (
        "load average "
        + ", ".join(f"{x:.2f}" for x in os.getloadavg())
        + f" ({os.cpu_count()} CPUs)"
    )


def run_cache(args: argparse.Namespace) -> None:
    print(f"Start: {load()}\n")
    with (
        tempfile.TemporaryDirectory(prefix="tdu-remote-cache-bench-") as tmp,
        contextlib.ExitStack() as stack,
    ):
        server = start_server(stack, tmp)
        direct = pafs.S3FileSystem(**server.pyarrow_options())
        print("... uploading", file=sys.stderr, flush=True)
        paths = upload(direct, args.rows, args.files, args.row_group)
        upload_small(direct, args.small_files, args.small_rows)
        local = download(direct, paths, Path(tmp) / "local")
        proxy = slow_proxy(stack, server, args.latency_ms)
        options = server.s3fs_options(endpoint_url=proxy.endpoint_url)
        limit = measure_limit(local, args.repeat)
        print(
            f"SeaweedFS on loopback behind the test suite's proxy, {args.latency_ms:g} ms "
            f"added per request: {limit.rows:,} rows in {args.files} files, "
            f"{limit.nbytes / 1e6:,.1f} MB, row groups of {args.row_group:,} rows; "
            f"{args.small_files:,} small files of {args.small_rows} rows\n"
        )
        cache_root = Path(tmp) / "cache"
        epochs = measure_epochs(args, proxy, options, cache_root)
        planning = measure_planning(proxy, options, cache_root)
    print_limit(limit)
    print_epochs(epochs, limit, args.latency_ms)
    print_planning(planning, args.small_files, args.small_rows, args.latency_ms)
    print(f"End: {load()}")
    wrong = failures(epochs, planning)
    if wrong:
        raise SystemExit("FAILED:\n" + "\n".join(f"- {w}" for w in wrong))
    print(
        "Checks: every epoch read every id once; cached epochs 2 made no request; warm "
        "planning only listed."
    )


def ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x.strip()]


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--cache",
        action="store_true",
        help="measure the node-local cache (see the docstring at the top of this file)",
    )
    parser.add_argument(
        "--rows", type=int, default=None, help="default 1,000,000 (400,000 with --cache)"
    )
    parser.add_argument("--files", type=int, default=8)
    parser.add_argument("--row-group", type=int, default=65_536)
    parser.add_argument(
        "--repeat", type=int, default=3, help="runs per configuration (with --cache: the limit's)"
    )
    parser.add_argument(
        "--latency-ms",
        type=float,
        default=None,
        help="delay every request by this much through the test suite's proxy (object stores "
        "answer in tens of ms; loopback in microseconds). The proxy is Python: it also caps "
        "throughput, so compare configurations within one run only. Default 0 (20 with --cache)",
    )
    cache = parser.add_argument_group("--cache")
    cache.add_argument(
        "--workers", type=ints, default=[2, 0], help="num_workers to measure (default 2,0)"
    )
    cache.add_argument("--small-files", type=int, default=2_000, help="files for planning")
    cache.add_argument("--small-rows", type=int, default=100, help="rows per small file")
    args = parser.parse_args()
    if args.rows is None:
        args.rows = 400_000 if args.cache else 1_000_000
    if args.latency_ms is None:
        args.latency_ms = 20.0 if args.cache else 0.0
    if args.cache:
        run_cache(args)
    else:
        run_reads(args)


if __name__ == "__main__":
    main()
