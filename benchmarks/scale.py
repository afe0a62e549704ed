"""Scale: plans of a million chunks, thousands of ranks, many small files, spawn workers.

Three sections (issue 15), each selectable with ``--only``:

- ``synthetic`` (no files): a `planning.Plan` of N chunks (N/10 files of 10 row groups, 50-5,000
  rows each), built as the formats and sources build it today. For each N it measures:

  (a) building the ``Chunk`` objects and the ``Plan(...)`` (fingerprint included), apart; the
      RSS the plan holds;
  (b) ``pickle.dumps`` of the plan (size, time) and ``pickle.loads`` (what every rank and every
      spawn worker pays);
  (c) one worker's stream for a shuffled epoch at each of ``--ranks`` ranks x 8 workers:
      ``resolve(plan.chunk_rows, ...)`` plus its pieces (what a worker does before its first
      read), in time and peak traced memory (tracemalloc, a second run);
  (d) elastic resume: a state taken in the middle of an epoch on 4,096 ranks x 8 workers,
      resumed on 2,048, 64 and 8 ranks x 8 workers: one new worker's ``resolve`` plus pieces.
  (e) a mixture's elastic resume: N chunks as 3 sources (40/30/30%), ``"random"`` mixing, a
      state taken mid-epoch on 512 ranks x 8 workers, resumed on 256, 64 and 8 ranks x 8
      workers: one new worker's ``resolve`` plus pieces, and apart its part that works out what
      the old leg left of each source (``MixEpoch.items``: every old stream), best of 3.

  Times are this process's CPU time by default (``--clock cpu``: steady on a shared machine;
  the section is single-threaded), each the best of up to 3 runs (1 past a second; the stream
  takes a new epoch per run). Each measurement runs under ``--max-seconds`` (on that clock):
  one that passes it is cut off, reported as "skipped (> X s)", and the larger sizes of that
  measurement (and, for resumes, the smaller new worlds) are skipped.

- ``files`` (local): ``--files`` Parquet files of ``--file-rows`` rows (an ``id`` column unique
  across files and a float), written once under ``benchmarks/.data``. Against the floor measured
  in the same run: planning (``create_dataloader(..., shuffle=True, num_workers=2,
  multiprocessing_context="spawn")``) against ``pq.read_metadata`` of every file in one thread;
  time to the first batch, and how far past a plain DataLoader's over a list with the same
  workers (the start-up floor); an epoch against a raw ``pyarrow.dataset(...).to_batches()``
  epoch, of one dataset object (whose fragments keep their parsed footers after its first
  epoch) and of a new one each epoch (footers read again, as our workers read them); the bytes
  of the dataset pickled for each spawn worker; every id read exactly once. Wall times; the
  footer floor and planning, then the start-up floor, our epoch and the raw epochs, are
  measured in turn for ``--rounds`` rounds, each reported as its best.

- ``remote`` (``--remote``, off by default): ``--remote-files`` files on SeaweedFS on loopback
  (the test suite's server tooling) behind the test suite's proxy adding ``--latency-ms`` to
  every request: footers read in one thread (a sample, scaled) and in 16 threads, planning and
  the first batch (and, with ``--remote-epoch``, an epoch with the exactly-once check).

Targets (issue 15) are printed next to the measurements.

- ``planning`` (``benchmarks/scale_planning.py``): planning spread over 1, 2 and 4 torchrun
  ranks (1 rank: rank-0-only planning) on ``--remote-files`` files behind the latency proxy,
  and a restart with ``cache_dir`` (20,000 local files, and the remote ones: requests by
  kind).

Usage::

    python benchmarks/scale.py                                  # synthetic 10k-1M + 20k files
    python benchmarks/scale.py --chunks 10000,100000 --files 2000   # quick (~1 minute)
    python benchmarks/scale.py --only synthetic --chunks 10000,100000 --ranks 8,4096
    python benchmarks/scale.py --only remote --remote-files 2000 --latency-ms 20
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import gc
import itertools
import json
import math
import os
import pickle
import signal
import sys
import tempfile
import time
import tracemalloc
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.parquet as pq

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
DATA = HERE / ".data"
SECTIONS = ("synthetic", "files", "remote", "planning")
T = TypeVar("T")


# --- helpers ----------------------------------------------------------------------------------


class Timeout(Exception):
    """A measurement ran past ``--max-seconds``."""


@contextlib.contextmanager
def deadline(seconds: float | None, *, cpu: bool = False) -> Iterator[None]:
    """Raise `Timeout` in this (main) thread once ``seconds`` have passed (POSIX timers): of
    wall time, or with ``cpu`` of this process's CPU time (steady on a busy machine)."""
    if not seconds or not hasattr(signal, "setitimer"):
        yield
        return

    def fire(signum: int, frame: object) -> None:
        raise Timeout

    timer, signum = (
        (signal.ITIMER_PROF, signal.SIGPROF) if cpu else (signal.ITIMER_REAL, signal.SIGALRM)
    )
    previous = signal.signal(signum, fire)
    signal.setitimer(timer, seconds)
    try:
        yield
    finally:
        signal.setitimer(timer, 0)
        signal.signal(signum, previous)


def timed(
    run: Callable[[], T],
    *,
    limit: float | None,
    repeat: int = 1,
    clock: Callable[[], float] = time.perf_counter,
) -> tuple[float, T]:
    """Best time of up to ``repeat`` runs (one when a run takes over a second) on ``clock``
    (wall time by default; ``time.process_time`` counts this process's CPU only, and then
    ``limit`` is CPU seconds too).

    Raises:
        Timeout: a run passed ``limit`` seconds.
    """
    best = math.inf
    result: Any = None
    for _ in range(max(1, repeat)):
        gc.collect()
        start = clock()
        with deadline(limit, cpu=clock is time.process_time):
            result = run()
        elapsed = clock() - start
        best = min(best, elapsed)
        if elapsed > 1.0:
            break
    return best, result


def traced_peak(run: Callable[[], object], *, limit: float | None, cpu: bool = False) -> float:
    """Peak bytes traced by tracemalloc above what was allocated before ``run``."""
    gc.collect()
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        tracemalloc.reset_peak()
        with deadline(limit, cpu=cpu):
            result = run()
        peak = tracemalloc.get_traced_memory()[1]
        del result
    finally:
        tracemalloc.stop()
    return float(peak - base)


def rss_bytes() -> float:
    """Resident set size of this process (NaN where it cannot be read)."""
    try:
        import psutil

        return float(psutil.Process().memory_info().rss)
    except ImportError:
        pass
    try:
        with open("/proc/self/statm") as statm:
            return float(int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE"))
    except (OSError, ValueError):
        return math.nan


def ints(text: str) -> list[int]:
    return [int(x.replace("_", "")) for x in text.split(",") if x.strip()]


def count(items: object) -> int:
    """Length of a list, tuple or array (the plan may become columnar)."""
    try:
        return len(items)  # type: ignore[arg-type]
    except TypeError:
        return sum(1 for _ in items)  # type: ignore[attr-defined]


def short(n: int) -> str:
    for unit, size in (("M", 1_000_000), ("k", 1_000)):
        if n >= size and n % size == 0:
            return f"{n // size}{unit}"
    return f"{n:,}"


def secs(value: float | None) -> str:
    if value is None:
        return "n/a"
    return f"{value * 1000:.1f} ms" if value < 1 else f"{value:.2f} s"


def mb(value: float | None) -> str:
    return "n/a" if value is None or math.isnan(value) else f"{value / 2**20:.1f} MB"


def ratio(a: float | None, b: float | None) -> str:
    if a is None or b is None or not b:
        return "n/a"
    return f"{a / b:.2f}x"


def table(header: Sequence[str], rows: Sequence[Sequence[str]], align: str = "") -> None:
    align = align or "l" + "r" * (len(header) - 1)
    print("| " + " | ".join(header) + " |")
    print("|" + "|".join(":--" if a == "l" else "--:" for a in align) + "|")
    for row in rows:
        print("| " + " | ".join(row) + " |")
    print()


def growth(name: str, sizes: Sequence[int], values: dict[int, float | None]) -> str:
    """``name: x(b)/x(a) for consecutive sizes``, e.g. 'x9.8 (10k->100k), x10.3 (100k->1M)'."""
    parts = []
    for a, b in itertools.pairwise(sizes):
        va, vb = values.get(a), values.get(b)
        if va and vb:
            parts.append(f"x{vb / va:.1f} ({short(a)}->{short(b)})")
    return f"{name}: " + (", ".join(parts) if parts else "n/a")


class Skips:
    """Which measurements to skip after one ran past the limit (larger sizes cost more)."""

    def __init__(self, limit: float | None, unit: str = "s") -> None:
        self.limit = limit
        self.unit = unit
        self.over: dict[str, int] = {}  # measurement -> the smallest size that timed out

    def skipped(self, key: str, size: int) -> bool:
        return key in self.over and size >= self.over[key]

    def hit(self, key: str, size: int) -> None:
        self.over[key] = min(size, self.over.get(key, size))

    def cell(self) -> str:
        return f"skipped (> {self.limit:g} {self.unit})"


# --- 1. synthetic plans -----------------------------------------------------------------------


SCHEMA = pa.schema([("id", pa.int64()), ("x", pa.float32())])
ROW_BYTES = 100  # bytes per row the synthetic chunks claim


def synthetic_inputs(n: int, seed: int = 0) -> dict[str, Any]:
    """Row counts and paths of ``n`` chunks: ``n / 10`` files of 10 row groups each."""
    rng = np.random.default_rng(seed)
    rows = rng.integers(50, 5001, n)
    files = max(1, -(-n // 10))
    paths = [f"/data/part-{i:05d}.parquet" for i in range(files)]
    per_file = np.bincount(np.arange(n) // 10, weights=rows * ROW_BYTES, minlength=files)
    return {
        "rows": rows,
        "rows_list": rows.tolist(),
        "paths": paths,
        # Each file's identity as listed (size, version token), as sources/files.py pins it.
        "files": {
            p: (int(s) + 1024, "1700000000000000000") for p, s in zip(paths, per_file, strict=True)
        },
    }


def build_chunks(inputs: dict[str, Any]) -> list[Any]:
    """One ``Chunk`` per row group, as formats/chunking.group_units makes them today."""
    from torch_dataloader_utils.planning import Chunk

    paths = inputs["paths"]
    return [
        Chunk(
            path=paths[i // 10],
            start=i % 10,
            stop=i % 10 + 1,
            num_rows=r,
            num_bytes=r * ROW_BYTES,
            unit_rows=(r,),
            partition=(),
        )
        for i, r in enumerate(inputs["rows_list"])
    ]


def build_plan(chunks: Sequence[Any], files: dict[str, tuple[int, str]]) -> Any:
    """``Plan(...)`` as sources/files.plan_source builds it (fingerprint computed inside)."""
    from torch_dataloader_utils.planning import Plan

    details_of = getattr(Plan, "details_of", None)
    details = (
        details_of(format="parquet", columns=["id", "x"], filter=None, hive=None)
        if details_of
        else ()
    )
    return Plan(
        chunks=tuple(chunks),
        schema=SCHEMA,
        row_bytes=float(ROW_BYTES),
        details=details,
        files=files,
    )


def make_layout(args: argparse.Namespace) -> Any:
    from torch_dataloader_utils.planning import Layout

    return Layout(
        batch_size=args.batch_size,
        shuffle=True,
        seed=0,
        drop_last=False,
        remainder="drop",
        block_rows=args.block_rows,
        first_block_rows=min(args.block_rows, 65_536),
        strategy="equal",
    )


def worker_stream(plan: Any, layout: Any, pass_: Any, topology: Any) -> Any:
    """What a worker does before its first read: its stream, then the stream's pieces."""
    from torch_dataloader_utils.planning.streams import OneSource

    stream = OneSource(plan.chunk_rows, layout).resolve(pass_, topology)
    return [p for rows in stream.sources for p in rows.pieces()]


def state_bytes(plan: Any, pass_: Any, world_size: int, workers: int, layout: Any) -> str:
    """Pickled bytes of the loader state at ``pass_`` (n/a if the codec moved)."""
    try:
        from torch_dataloader_utils.state.codec import encode_state

        state = encode_state(
            plan,
            pass_,
            world_size=world_size,
            num_workers=workers,
            layout=layout,
            complete=False,
        )
        return f"{len(pickle.dumps(state))} / {len(json.dumps(state))}"
    except Exception as exc:  # a report, not a check
        return f"n/a ({type(exc).__name__})"


class Synthetic:
    """The synthetic measurements of one run: the rows of each table and the growth laws."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.layout = make_layout(args)
        self.skips = Skips(args.max_seconds, "CPU s" if args.clock == "cpu" else "s")
        self.plan_rows: list[list[str]] = []
        self.stream_rows: list[list[str]] = []
        self.resume_rows: list[list[str]] = []
        self.mix_rows: list[list[str]] = []
        self.law: dict[str, dict[int, float | None]] = {}

    def timed(self, run: Callable[[], T], *, repeat: int = 1) -> tuple[float, T]:
        clock = time.process_time if self.args.clock == "cpu" else time.perf_counter
        return timed(run, limit=self.args.max_seconds, repeat=repeat, clock=clock)

    def keep(self, key: str, n: int, value: float | None) -> None:
        self.law.setdefault(key, {})[n] = value

    def size(self, n: int) -> None:
        """Every measurement at ``n`` chunks."""
        inputs = synthetic_inputs(n)
        total = int(inputs["rows"].sum())
        plan = self.plan(n, inputs, total)
        del inputs
        for r in sorted(self.args.ranks):
            self.stream(n, plan, r)
        self.resume(n, plan, total)
        del plan
        gc.collect()
        self.mixture_resume(n)

    def plan(self, n: int, inputs: dict[str, Any], total: int) -> Any:
        """(a) build and fingerprint, (b) pickle: one row of the plan table."""
        skips = self.skips
        cells = [short(n), f"{len(inputs['paths']):,}", f"{total:,}"]
        gc.collect()
        before = rss_bytes()
        plan = None
        try:
            if skips.skipped("build", n):
                raise Timeout
            t_chunks, chunks = self.timed(lambda: build_chunks(inputs))
            t_plan, plan = self.timed(functools.partial(build_plan, chunks, inputs["files"]))
            del chunks
            gc.collect()
            held = rss_bytes() - before
            t_rows, _ = self.timed(lambda: plan.chunk_rows)  # once: the first access
            cells += [secs(t_chunks), secs(t_plan), secs(t_chunks + t_plan), secs(t_rows)]
            cells.append(mb(held))
            self.keep("Chunk objects", n, t_chunks)
            self.keep("Plan(...)", n, t_plan)
            self.keep("build total", n, t_chunks + t_plan)
            self.keep("plan held (RSS)", n, held)
        except Timeout:
            skips.hit("build", n)
            self.plan_rows.append([*cells, skips.cell(), *["-"] * 7])
            return None
        try:
            if skips.skipped("pickle", n):
                raise Timeout
            t_dump, blob = self.timed(lambda: pickle.dumps(plan))  # once: nothing cached yet
            t_load, _ = self.timed(lambda: pickle.loads(blob), repeat=3)
            cells += [mb(len(blob)), secs(t_dump), secs(t_load)]
            self.keep("pickle size", n, float(len(blob)))
            self.keep("pickle.dumps", n, t_dump)
            self.keep("pickle.loads", n, t_load)
        except Timeout:
            skips.hit("pickle", n)
            cells += [skips.cell(), "-", "-"]
        self.plan_rows.append(cells)
        return plan

    def stream(self, n: int, plan: Any, ranks: int) -> None:
        """(c) the first worker of the last rank resolves its stream in a fresh epoch (a stream's
        cost does not depend on where it sits; the last worker of a rank may hold no rows)."""
        from torch_dataloader_utils.planning import Pass, Topology

        limit, skips, workers = self.args.max_seconds, self.skips, self.args.workers_per_rank
        key = f"stream {ranks}"
        cells = [short(n), f"{ranks} x {workers}"]
        if plan is None or skips.skipped(key, n):
            self.stream_rows.append([*cells, skips.cell(), "-", "-"])
            return
        topology = Topology(rank=ranks - 1, world_size=ranks, worker=0, num_workers=workers)

        epochs = itertools.count(1)

        def fresh() -> Any:
            # Each run a new epoch: nothing one epoch's stream computed can serve the next.
            return worker_stream(plan, self.layout, Pass(next(epochs)), topology)

        try:
            t_stream, pieces = self.timed(fresh, repeat=3)
            peak = (
                None
                if self.args.no_memory
                else traced_peak(fresh, limit=limit, cpu=self.args.clock == "cpu")
            )
        except Timeout:
            skips.hit(key, n)
            self.stream_rows.append([*cells, skips.cell(), "-", "-"])
            return
        self.stream_rows.append([*cells, secs(t_stream), f"{count(pieces):,}", mb(peak)])
        self.keep(f"stream ({ranks} ranks)", n, t_stream)
        self.keep(f"stream peak ({ranks} ranks)", n, peak)

    def resume(self, n: int, plan: Any, total: int) -> None:
        """(d) a state from the middle of an epoch on ``--resume-from`` ranks, resumed on each
        of ``--resume-to``: the first worker of the last new rank resolves its stream."""
        from torch_dataloader_utils.planning import Leg, Pass, Topology

        args, skips, layout = self.args, self.skips, self.layout
        old, workers = args.resume_from, args.workers_per_rank
        share = total // old  # remainder "drop": every rank reads total // world_size rows
        middle = layout.batches(share) // 2
        leg = Leg(world_size=old, num_workers=workers, layout=layout, batches=middle)
        pass_ = Pass(1, legs=(leg,), batches=0)
        saved = Pass(1, batches=middle)
        state = state_bytes(plan, saved, old, workers, layout) if plan is not None else "-"
        for r in sorted(args.resume_to, reverse=True):  # cheapest first
            key = f"resume {r}"
            cells = [short(n), f"{old} x {workers} -> {r} x {workers}", f"{middle}", state]
            # Smaller new worlds cost more: one past the limit skips them too.
            if plan is None or any(
                skips.skipped(f"resume {q}", n) for q in args.resume_to if q >= r
            ):
                self.resume_rows.append([*cells, skips.cell(), "-"])
                skips.hit(key, n)
                continue
            topology = Topology(rank=r - 1, world_size=r, worker=0, num_workers=workers)

            def resumed(topology: Any = topology) -> Any:
                return worker_stream(plan, layout, pass_, topology)

            try:
                t_resume, pieces = self.timed(resumed)
            except Timeout:
                skips.hit(key, n)
                self.resume_rows.append([*cells, skips.cell(), "-"])
                continue
            self.resume_rows.append([*cells, secs(t_resume), f"{count(pieces):,}"])
            self.keep(f"elastic resume -> {r} ranks", n, t_resume)

    def mixture_resume(self, n: int) -> None:
        """(e) a mixture of 3 sources saved mid-epoch on ``--mix-resume-from`` ranks, resumed on
        each of ``--mix-resume-to``: the first worker of the last new rank resolves its stream
        (best of 3, each with nothing cached), and apart works out the old leg's rest."""
        from torch_dataloader_utils.planning import Leg, Pass, Topology
        from torch_dataloader_utils.planning.mixture import Mixture, quotas
        from torch_dataloader_utils.planning.streams import Mixed

        args, skips, layout = self.args, self.skips, self.layout
        rows = synthetic_inputs(n)["rows"]
        cuts = [n * 4 // 10, n * 7 // 10]
        sources = tuple(np.asarray(part) for part in np.split(rows, cuts))
        sizes = [int(part.sum()) for part in sources]
        mixture = Mixture(sources, tuple(quotas(sizes, None, None)), "random")
        streams = Mixed(mixture, layout)
        old, workers = args.mix_resume_from, args.workers_per_rank
        middle = streams.rank_batches(Topology(0, old, 0, workers)) // 2
        leg = Leg(world_size=old, num_workers=workers, layout=layout, batches=middle)
        pass_ = Pass(1, legs=(leg,))
        parts = "/".join(
            short(len(part)) if len(part) >= 1000 else str(len(part)) for part in sources
        )
        for r in sorted(args.mix_resume_to, reverse=True):  # cheapest first
            key = f"mixture resume {r}"
            cells = [short(n), parts, f"{old} x {workers} -> {r} x {workers}", f"{middle}"]
            if any(skips.skipped(f"mixture resume {q}", n) for q in args.mix_resume_to if q >= r):
                self.mix_rows.append([*cells, skips.cell(), "-", "-"])
                skips.hit(key, n)
                continue
            topology = Topology(rank=r - 1, world_size=r, worker=0, num_workers=workers)

            def resumed(topology: Any = topology) -> Any:
                stream = streams.resolve(pass_, topology)
                return [p for rows in stream.sources for p in rows.pieces()]

            def rest(topology: Any = topology) -> Any:
                steps = (topology.world_size, 0)
                readers = (topology.world_size, workers)
                return mixture.epoch(layout, 1, (leg,), readers=readers, steps=steps).items

            try:
                t_resume, pieces = min((self.timed(resumed) for _ in range(3)), key=lambda x: x[0])
                t_rest = min(self.timed(rest)[0] for _ in range(3))
            except Timeout:
                skips.hit(key, n)
                self.mix_rows.append([*cells, skips.cell(), "-", "-"])
                continue
            self.mix_rows.append([*cells, secs(t_resume), secs(t_rest), f"{count(pieces):,}"])
            self.keep(f"mixture elastic resume -> {r} ranks", n, t_resume)


def run_synthetic(args: argparse.Namespace) -> None:
    sizes = sorted(args.chunks)
    ranks = sorted(args.ranks)
    resume_to = sorted(args.resume_to, reverse=True)
    workers, old, limit = args.workers_per_rank, args.resume_from, args.max_seconds
    run = Synthetic(args)
    print(
        f"## Synthetic plans: N chunks (N/10 files x 10 row groups of 50-5,000 rows), "
        f"batch {args.batch_size}, shuffle blocks of {args.block_rows:,} rows "
        f"(first {run.layout.first_block_rows:,}), {workers} workers per rank, "
        f"times: {'CPU (process_time)' if args.clock == 'cpu' else 'wall'}, best of up to 3 "
        f"(1 past a second), --max-seconds {limit:g}\n"
    )
    for n in sizes:
        print(f"... {short(n)} chunks", file=sys.stderr, flush=True)
        run.size(n)
        gc.collect()
    law = run.law

    print("### (a, b) Plan build, fingerprint, pickle\n")
    table(
        [
            "chunks",
            "files",
            "rows",
            "Chunk objects",
            "Plan(...) (fingerprint)",
            "build total",
            "plan.chunk_rows",
            "plan held (RSS)",
            "pickle size",
            "pickle.dumps",
            "pickle.loads",
        ],
        run.plan_rows,
    )
    print("Targets at 1M chunks: plan built and fingerprinted <= 3 s; compact form <= 16 MB.\n")
    print("### (c) One worker's stream, fresh shuffled epoch (the first worker of the last rank)\n")
    table(
        ["chunks", "ranks x workers", "resolve + pieces", "pieces", "peak traced"], run.stream_rows
    )
    print("Target at 1M chunks: a worker's stream <= 0.2 s.\n")
    print(
        f"### (d) Elastic resume: state taken mid-epoch on {old} x {workers}, one new worker "
        "(the first of the last rank) resolves its stream\n"
    )
    table(
        [
            "chunks",
            "old -> new (ranks x workers)",
            "batches per rank at save",
            "state bytes (pickle / JSON)",
            "resolve + pieces",
            "pieces",
        ],
        run.resume_rows,
    )
    print(f"Target at 1M chunks: elastic resume {old} -> 8 ranks <= 2 s per worker.\n")
    mix_old = args.mix_resume_from
    print(
        f"### (e) A mixture's elastic resume: 3 sources, state taken mid-epoch on {mix_old} x "
        f"{workers}, one new worker (the first of the last rank) resolves its stream\n"
    )
    table(
        [
            "chunks",
            "sources' chunks",
            "old -> new (ranks x workers)",
            "batches per rank at save",
            "resolve + pieces",
            "of which the old leg's rest",
            "pieces",
        ],
        run.mix_rows,
    )
    print(f"Target at 1M chunks: a mixture's elastic resume from {mix_old} x {workers} <= 1 s.\n")
    print("### Growth laws (each a ratio between consecutive chunk counts)\n")
    for name, values in law.items():
        if len(sizes) > 1:
            print(f"- {growth(name, sizes, values)}")
    for n in sizes:
        by_rank = {r: law.get(f"stream ({r} ranks)", {}).get(n) for r in ranks}
        if len(ranks) > 1 and all(by_rank.values()):
            lo, hi = ranks[0], ranks[-1]
            print(
                f"- stream at {short(n)} chunks: {hi} ranks / {lo} ranks "
                f"x{by_rank[hi] / by_rank[lo]:.2f}"
            )
        by_new = {r: law.get(f"elastic resume -> {r} ranks", {}).get(n) for r in resume_to}
        done = [r for r in resume_to if by_new[r]]
        if len(done) > 1:
            a, b = done[0], done[-1]
            print(
                f"- elastic resume at {short(n)} chunks: -> {b} ranks / -> {a} ranks "
                f"x{by_new[b] / by_new[a]:.1f}"
            )
    print()


# --- 2. real small files ----------------------------------------------------------------------


def make_small_files(root: Path, files: int, rows: int) -> Path:
    """``files`` Parquet files of ``rows`` rows: ``id`` (unique across files) and ``x``."""
    out = root / f"small-{files}x{rows}"
    if (out / "_done").exists():
        return out
    out.mkdir(parents=True, exist_ok=True)
    print(f"... writing {files:,} files under {out}", file=sys.stderr, flush=True)
    rng = np.random.default_rng(0)
    for i in range(files):
        table = pa.table(
            {
                "id": pa.array(np.arange(i * rows, (i + 1) * rows, dtype=np.int64)),
                "x": pa.array(rng.random(rows, dtype=np.float32)),
            }
        )
        pq.write_table(table, out / f"part-{i:06d}.parquet")
    (out / "_done").touch()
    return out


def dataset_pickles(dataset: object) -> list[list[str]]:
    """Bytes (and time) of the dataset pickled as a spawn worker receives it."""
    import multiprocessing.reduction

    import torch.multiprocessing  # noqa: F401 - registers torch's reducers on ForkingPickler

    rows = []
    for name, dumps in (
        ("pickle.dumps(loader.dataset)", pickle.dumps),
        ("ForkingPickler.dumps(loader.dataset)", multiprocessing.reduction.ForkingPickler.dumps),
    ):
        seconds, blob = timed(lambda dumps=dumps: bytes(dumps(dataset)), limit=None)
        loads, _ = timed(lambda blob=blob: pickle.loads(blob), limit=None)
        rows.append(
            [
                name,
                f"{len(blob):,} B ({len(blob) / 1024:.0f} KiB); dumps {secs(seconds)}, "
                f"loads {secs(loads)}",
                "",
                "<= 256 KiB",
            ]
        )
    return rows


def read_epoch(loader: Any) -> tuple[float, float, np.ndarray]:
    """Time to the first batch and to the last (from ``iter``), and every id read."""
    ids: list[np.ndarray] = []
    start = time.perf_counter()
    it = iter(loader)
    first = None
    for batch in it:
        if first is None:
            first = time.perf_counter() - start
        ids.append(np.asarray(batch["id"]).copy())
    epoch = time.perf_counter() - start
    del it
    return first or 0.0, epoch, np.concatenate(ids) if ids else np.zeros(0, np.int64)


def exactly_once(ids: np.ndarray, total: int) -> tuple[bool, str]:
    counts = Counter(ids.tolist())
    expected = Counter(range(total))
    if counts == expected:
        return True, f"every id exactly once ({total:,} ids)"
    missing = sum((expected - counts).values())
    extra = sum((counts - expected).values())
    return False, f"NOT exactly once: {missing:,} ids missing, {extra:,} extra of {total:,}"


def startup_floor(args: argparse.Namespace) -> float | None:
    """Time to the first batch of a plain DataLoader over a list, with the same workers and
    start method: what starting the workers costs before any reading."""
    if not args.workers:
        return None
    from torch.utils.data import DataLoader

    loader = DataLoader(
        list(range(4 * args.batch_size)),
        batch_size=args.batch_size,
        num_workers=args.workers,
        multiprocessing_context=args.context,
    )
    start = time.perf_counter()
    it = iter(loader)
    next(it)
    seconds = time.perf_counter() - start
    del it
    return seconds


def loader_options(args: argparse.Namespace) -> dict[str, Any]:
    options: dict[str, Any] = {
        "shuffle": True,
        "num_workers": args.workers,
        "batch_size": args.batch_size,
    }
    if args.workers:
        options["multiprocessing_context"] = args.context
    return options


def run_files(args: argparse.Namespace) -> bool:
    import torch_dataloader_utils as tdu

    root = make_small_files(DATA, args.files, args.file_rows)
    paths = sorted(root.glob("*.parquet"))
    total = args.files * args.file_rows
    how = f"{args.workers} {args.context} workers" if args.workers else "in-process"
    rounds = max(1, args.rounds)
    print(
        f"## Small local files: {args.files:,} Parquet files of {args.file_rows} rows "
        f"({total:,} rows), shuffle on, {how}, batch {args.batch_size}; each time the best "
        f"of {rounds} rounds (footer floor and planning; start-up floor, our epoch, raw epochs: "
        "each one after another)\n"
    )

    def footers() -> int:
        return sum(pq.read_metadata(p).num_rows for p in paths)

    # The footer floor and our planning in turn, each its best of the rounds: one of each
    # moved by up to 40% between runs on this machine (a first read of a cold page cache).
    footer_reads, plannings = [], []
    loader = None
    for _ in range(rounds):
        floor, rows = timed(footers, limit=None)
        assert rows == total, (rows, total)
        footer_reads.append(floor)
        del loader  # (the last round's, before planning again)
        gc.collect()
        start = time.perf_counter()
        loader = tdu.create_dataloader(str(root), **loader_options(args))
        plannings.append(time.perf_counter() - start)
    floor, planning = min(footer_reads), min(plannings)
    discovery, dataset = timed(lambda: ds.dataset(str(root), format="parquet"), limit=None)
    pickles = dataset_pickles(loader.dataset)
    # Interleaved, so that a busy machine slows the references as much as the loader.
    firsts, epochs, raws, floors, verdicts = [], [], [], [], []
    freshes: list[float] = []
    for _ in range(rounds):
        floors.append(startup_floor(args))
        first, epoch, ids = read_epoch(loader)
        firsts.append(first)
        epochs.append(epoch)
        verdicts.append(exactly_once(ids, total))
        del ids
        raw, raw_rows = timed(lambda: sum(b.num_rows for b in dataset.to_batches()), limit=None)
        assert raw_rows == total, (raw_rows, total)
        raws.append(raw)
        # pyarrow's fragments keep the footers they parsed: the dataset above reads them in
        # its first epoch only. A new one reads them again, as our workers do every epoch.
        fresh, raw_rows = timed(
            lambda: sum(b.num_rows for b in ds.dataset(str(root), format="parquet").to_batches()),
            limit=None,
        )
        assert raw_rows == total, (raw_rows, total)
        freshes.append(fresh)
    del loader
    first, epoch, raw, fresh = min(firsts), min(epochs), min(raws), min(freshes)
    floor_start = min((f for f in floors if f is not None), default=None)
    over = None if floor_start is None else first - floor_start

    def past_floor(label: str, limit: float, name: str) -> list[str]:
        """The row of our epoch less the start-up floor, against ``limit`` (called ``name``)."""
        if floor_start is None:
            return [label, "n/a", "n/a", ""]
        return [label, secs(epoch - floor_start), f"{ratio(epoch - floor_start, limit)} {name}", ""]

    table(
        ["measure", "time / size", "ratio", "target"],
        [
            ["pq.read_metadata of every file, one thread (floor)", secs(floor), "1.00x", ""],
            ["pyarrow.dataset discovery", secs(discovery), f"{ratio(discovery, floor)} floor", ""],
            [
                "create_dataloader (planning)",
                secs(planning),
                f"{ratio(planning, floor)} floor",
                "<= 1.5x floor",
            ],
            [f"first batch (from iter, {how})", secs(first), "", "<= 1 s"],
            [
                f"plain DataLoader over a list, first batch ({how}: start-up floor)",
                secs(floor_start),
                "",
                "",
            ],
            [
                "first batch past the start-up floor",
                "n/a" if over is None else f"{over * 1000:+.0f} ms",
                "",
                "<= 300 ms",
            ],
            [
                "epoch (from iter, first batch included)",
                secs(epoch),
                f"{ratio(epoch, raw)} raw",
                "<= 1.2x raw",
            ],
            past_floor("epoch past the start-up floor (reading, once the workers run)", raw, "raw"),
            ["raw pyarrow.dataset to_batches() epoch", secs(raw), "1.00x", ""],
            [
                "raw, a new pyarrow.dataset each epoch (its footers read again, as ours are)",
                secs(fresh),
                f"{ratio(fresh, raw)} raw",
                "",
            ],
            past_floor("epoch past the start-up floor, against that", fresh, "new raw"),
            *pickles,
        ],
        align="lrrr",
    )
    print(
        "Rounds: footer floor "
        + ", ".join(secs(f) for f in footer_reads)
        + "; planning "
        + ", ".join(secs(p) for p in plannings)
        + "; first batch "
        + ", ".join(secs(f) for f in firsts)
        + "; start-up floor "
        + ", ".join(secs(f) for f in floors)
        + "; epoch "
        + ", ".join(f"{secs(e)} ({ratio(e, r)})" for e, r in zip(epochs, raws, strict=True))
        + ".\n"
    )
    ok = all(good for good, _ in verdicts)
    print(f"Exactly once, each round: {'; '.join(v for _, v in verdicts)}\n")
    return ok


# --- 3. remote small files --------------------------------------------------------------------

BUCKET = "scale"


def run_remote(args: argparse.Namespace) -> bool:
    """Small files on SeaweedFS behind a latency proxy: planning and the first batch."""
    sys.path.insert(0, str(ROOT))  # the test suite's server tooling
    os.environ.setdefault("AWS_EC2_METADATA_DISABLED", "true")
    try:
        import pyarrow.fs as pafs
        from tests.services.seaweedfs import start_seaweedfs

        from scale_planning import upload_behind_proxy  # (beside this file)
    except ImportError as exc:
        print(f"## Remote small files: skipped ({exc}: run from a checkout with tests/)\n")
        return True

    import torch_dataloader_utils as tdu

    files, per = args.remote_files, args.remote_rows
    total = files * per
    how = f"{args.workers} {args.context} workers" if args.workers else "in-process"
    ok = True
    with tempfile.TemporaryDirectory(prefix="tdu-scale-bench-") as tmp:
        try:
            server = start_seaweedfs(Path(tmp), access_key="bench", secret_key="bench-secret")
        except Exception as exc:  # no weed binary, no free ports, ...
            print(f"## Remote small files: skipped (SeaweedFS did not start: {exc})\n")
            return True
        with contextlib.ExitStack() as stack:
            stack.callback(server.stop)
            server.create_bucket(BUCKET)
            keys = [f"{BUCKET}/small/part-{i:06d}.parquet" for i in range(files)]

            def table_of(i: int) -> pa.Table:
                ids = pa.array(np.arange(i * per, (i + 1) * per, dtype=np.int64))
                return pa.table({"id": ids, "x": pa.array(np.ones(per, np.float32))})

            proxy = upload_behind_proxy(server, stack, keys, table_of, args.latency_ms)
            endpoint = proxy.endpoint_url
            slow = pafs.S3FileSystem(
                **{**server.pyarrow_options(), "endpoint_override": endpoint.split("//")[1]}
            )
            options = server.s3fs_options(endpoint_url=endpoint)
            print(
                f"## Remote small files: {files:,} Parquet files of {per} rows on SeaweedFS "
                f"(loopback), {args.latency_ms:g} ms added per request, shuffle on, {how}\n"
            )
            sample = keys[: max(1, min(args.remote_sample, files))]
            one, _ = timed(
                lambda: [pq.read_metadata(k, filesystem=slow) for k in sample], limit=None
            )
            one *= files / len(sample)
            with ThreadPoolExecutor(16) as pool:
                many, _ = timed(
                    lambda: list(pool.map(lambda k: pq.read_metadata(k, filesystem=slow), keys)),
                    limit=None,
                )
            proxy.reset_counts()
            start = time.perf_counter()
            loader = tdu.create_dataloader(
                f"s3://{BUCKET}/small/", storage_options=options, **loader_options(args)
            )
            planning = time.perf_counter() - start
            size = len(pickle.dumps(loader.dataset))
            if args.remote_epoch:
                first, epoch, ids = read_epoch(loader)
                ok, verdict = exactly_once(ids, total)
            else:
                start = time.perf_counter()
                it = iter(loader)
                next(it)
                first = time.perf_counter() - start
                del it
                epoch, verdict = None, "not checked (no --remote-epoch)"
            del loader
            requests = proxy.counts["requests"]
            floor_start = startup_floor(args)
            table(
                ["measure", "time / size", "ratio", "target"],
                [
                    [
                        f"pq.read_metadata, one thread ({len(sample)} files, scaled to "
                        f"{files:,}) (floor)",
                        secs(one),
                        "1.00x",
                        "",
                    ],
                    ["pq.read_metadata, 16 threads, every file", secs(many), ratio(many, one), ""],
                    ["create_dataloader (planning)", secs(planning), ratio(planning, one), ""],
                    [f"first batch (from iter, {how})", secs(first), "", "<= 3 s"],
                    [
                        f"plain DataLoader over a list, first batch ({how}: start-up floor)",
                        secs(floor_start),
                        "",
                        "",
                    ],
                    ["epoch (from iter)", secs(epoch), "", ""],
                    ["pickle.dumps(loader.dataset)", f"{size:,} B", "", "<= 256 KiB"],
                ],
                align="lrrr",
            )
            print(f"Requests through the proxy (planning and reading): {requests:,}. {verdict}\n")
    return ok


# --- main -------------------------------------------------------------------------------------


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__.splitlines()[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--only",
        default=None,
        help=f"comma-separated sections of {', '.join(SECTIONS)} (default: synthetic,files; "
        "remote with --remote)",
    )
    parser.add_argument("--remote", action="store_true", help="also run the remote section")
    parser.add_argument(
        "--max-seconds",
        type=float,
        default=60.0,
        help="per synthetic measurement (on the --clock it is timed with)",
    )
    parser.add_argument("--batch-size", type=int, default=1024)
    synthetic = parser.add_argument_group("synthetic")
    synthetic.add_argument("--chunks", type=ints, default=[10_000, 100_000, 1_000_000])
    synthetic.add_argument("--ranks", type=ints, default=[8, 4096])
    synthetic.add_argument("--workers-per-rank", type=int, default=8)
    synthetic.add_argument("--resume-from", type=int, default=4096, help="ranks at the save")
    synthetic.add_argument("--resume-to", type=ints, default=[2048, 64, 8])
    synthetic.add_argument(
        "--mix-resume-from", type=int, default=512, help="ranks at a mixture's save"
    )
    synthetic.add_argument("--mix-resume-to", type=ints, default=[256, 64, 8])
    synthetic.add_argument(
        "--block-rows",
        type=int,
        default=655_360,
        help="shuffle block rows (the default: 64 MiB of 100-byte rows, whole batches)",
    )
    synthetic.add_argument(
        "--clock",
        choices=("cpu", "wall"),
        default="cpu",
        help="what the synthetic section times: this process's CPU time (steady on a busy "
        "machine; the section is single-threaded Python and numpy) or wall time",
    )
    synthetic.add_argument("--no-memory", action="store_true", help="skip the tracemalloc runs")
    files = parser.add_argument_group("files and remote")
    files.add_argument("--files", type=int, default=20_000)
    files.add_argument("--file-rows", type=int, default=50)
    files.add_argument("--workers", type=int, default=2, help="DataLoader workers")
    files.add_argument("--context", default="spawn", help="multiprocessing start method")
    files.add_argument(
        "--rounds", type=int, default=3, help="files: rounds of floor, epoch and raw epoch"
    )
    files.add_argument("--remote-files", type=int, default=2_000)
    files.add_argument("--remote-rows", type=int, default=100)
    files.add_argument("--latency-ms", type=float, default=20.0)
    files.add_argument(
        "--remote-sample", type=int, default=200, help="files read for the one-thread floor"
    )
    files.add_argument("--remote-epoch", action="store_true", help="also read a whole epoch")
    args = parser.parse_args()
    if args.only:
        sections = [s.strip() for s in args.only.split(",") if s.strip()]
        unknown = set(sections) - set(SECTIONS)
        if unknown:
            parser.error(f"--only: unknown sections {sorted(unknown)}; choose from {SECTIONS}")
    else:
        sections = ["synthetic", "files", *(["remote"] if args.remote else [])]

    import torch  # noqa: F401 - imported before timing, as a training script would

    print(
        f"Python {sys.version.split()[0]}, pyarrow {pa.__version__}, numpy {np.__version__}, "
        f"{os.cpu_count()} CPUs\n"
    )
    ok = True
    if "synthetic" in sections:
        run_synthetic(args)
    if "files" in sections:
        ok = run_files(args) and ok
    if "remote" in sections:
        ok = run_remote(args) and ok
    if "planning" in sections:
        import scale_planning  # (beside this file)

        planning = argparse.Namespace(
            local_files=args.files,
            remote_files=args.remote_files,
            rows=args.remote_rows,
            latency_ms=args.latency_ms,
            ranks=[1, 2, 4],
            repeat=3,
        )
        scale_planning.run_local(planning)
        scale_planning.run_remote(planning)
    if not ok:
        raise SystemExit("exactly-once check failed")


if __name__ == "__main__":
    main()
