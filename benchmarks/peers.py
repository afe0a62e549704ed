"""Throughput against the peers (Lance, Ray Data, HF ``datasets``, MosaicML Streaming, LitData,
Petastorm, Daft) on the same data, as ratios to the shuffled and the unshuffled limit measured in
the same run.

Data (written once under ``benchmarks/.data`` by benchmarks/throughput.py's ``make_tabular`` and
``make_tokens``): ``tabular``, 2M rows (``--rows``) of an ``int64`` id, 8 float32, an int64, a
20-char string and a 64-float ``fixed_size_list`` embedding, 8 files; ``narrow``, the same with a
32-float embedding and strings of 15-25 characters (half the bytes a row); ``tokens``, 125k rows
(``--token-rows``) of an id and a ``list<int32>`` of 32..992 tokens, 4 files. Ids run from 0.
``--datasets`` picks among them (all three by default).

Configurations, each in its own subprocess, batch size 1024, two epochs each (epoch 2 timed):

- the shuffled limit (``x shuffled`` divides by it): throughput.py's ``raw-shuffled``, its
  `shuffled_batches` (pyarrow's threaded dataset reader, every ~64 MiB of decoded rows permuted
  with ``Table.take``, batches cut from it) + zero-copy torch, token lists as values + offsets;
- the unshuffled limit (``x raw``): raw pyarrow ``ParquetFile.iter_batches`` + zero-copy torch,
  one process, no shuffle, with and without pyarrow's threads (throughput.py's ``raw`` and
  ``raw-threads``); the faster of the two;
- ours: ``tdu.create_dataloader(dir, batch_size=1024, shuffle=True, num_workers=0 | 2,
  persistent_workers=w > 0, list_format="padded" | "offsets")``, as throughput.py runs it;
- Lance (``pylance``): the Parquet files written once as a Lance dataset (cached under
  ``benchmarks/.data/peers``; the time is reported apart), read ``scan``: through
  ``lance.torch.data.LanceDataset`` with a ``ShardedBatchSampler(randomize=True)`` (1024-row
  ranges in a new random order each epoch, split between the DataLoader's workers), and
  ``take``: a map-style dataset of ``dataset.take(indices)`` under a ``RandomSampler`` (a full
  row permutation each epoch); workers 0 and 2, spawned (Lance is not fork-safe);
- Ray Data: ``ray.data.read_parquet(dir)``, each epoch ``randomize_block_order()`` then
  ``iter_torch_batches(local_shuffle_buffer_size=...)`` (the buffer holds as many rows as ours'
  64 MiB shuffle block: the same kind of shuffle as ours), and ``random_shuffle()`` (a global row
  permutation); ``ray.init(num_cpus=2, object_store_memory=2 GiB)``, so no ``num_workers``;
- HF ``datasets``: ``load_dataset("parquet", data_files=...)`` (its Arrow cache made once, the
  time reported apart), ``.with_format("torch")``, in a torch ``DataLoader`` whose sampler is a
  ``BatchSampler(RandomSampler(...), 1024)`` (a full row permutation each epoch, each batch one
  ``dataset[indices]`` call), workers 0 and 2 (persistent, forked). On tokens, twice: ``HF
  list``, HF's own batch (the token lists a list of tensors), and ``HF padded``, the list padded
  in the worker by a ``collate_fn`` (``pad_sequence``), as ours pads.
- MosaicML Streaming: the rows written once with ``MDSWriter`` (uncompressed, 64 MiB shards,
  cached under ``benchmarks/.data/peers``, the time reported apart), read with
  ``StreamingDataset(local=..., shuffle=True, batch_size=1024)`` (its default shuffle, ``py1e``:
  shards and rows within a window of them) in a torch ``DataLoader``, workers 0 and 2;
- LitData: the rows written once with ``litdata.optimize`` (64 MB chunks, cached, the time apart),
  read with ``StreamingDataset(dir, shuffle=True)`` in its ``StreamingDataLoader`` (chunks in a
  new order each epoch, rows shuffled within the chunks a worker holds), workers 0 and 2;
- Petastorm: ``make_batch_reader(file://dir, shuffle_row_groups=True)`` straight on the Parquet
  files, in its ``BatchedDataLoader`` with a shuffling queue as large as ours' 64 MiB block;
  its reader's thread pool of 2 (it has no ``num_workers``);
- Daft: ``daft.read_parquet(files)``, each epoch ``shuffle(seed=...)`` (a full row permutation),
  then ``Daft to_torch``, its own ``to_torch_dataloader(batch_size=1024)`` (the embedding and
  token lists come as Python lists of lists), or ``Daft arrow``, its ``to_arrow_iter()`` cut to
  1024-row batches and converted as the limit converts; Daft's own threads (no
  ``num_workers``).

Streaming and LitData hand the DataLoader one row at a time: their batches are collated from
rows (numbers stacked, strings a list, token lists padded, as ours pads).

``--only`` picks among ours and the peers; the limits always run.

Every peer runs in its own virtualenv under ``benchmarks/peers/.venv/`` (made by
``peers/setup.sh`` on the first run; see ``peers/run.py`` for each one's code). A peer that cannot
be installed, imported or run gets a row ``not available: <reason>`` and the run goes on.

Columns: ``rows/s`` is the warm epoch's (the second; every row of it read); ``x shuffled`` and
``x raw`` its ratios to the shuffled and the unshuffled limit; ``first batch s`` the cold epoch's
time to its first batch, from after the imports (so set-up included: ``ray.init``, planning, worker
start); ``RSS / PSS MB`` the peak of the summed RSS of the process and all its descendants
(workers, Ray's processes), sampled every 0.1 s from outside, then the same for PSS (shared pages
split between the processes that map them: forked workers share the parent's, Ray's object store is
shared memory). Every epoch of every configuration is checked by id: each id exactly once; one that
is not is said in ``notes``. Batch formats differ (``notes``): Lance, Ray, Daft and the limits give
lists as values + offsets (the limit's zero-copy conversion, which Lance and Ray are given since
their own converters refuse strings and ragged lists), HF a list of tensors (its torch format also
makes int32 int64), Streaming and LitData padded (collated from rows; LitData's float32 come back
float64), Daft's ``to_torch_dataloader`` lists of Python lists, ours padded or values + offsets;
strings are Python lists everywhere.

Usage::

    python benchmarks/peers.py                  # full size: over an hour on 2 cores, mostly
                                                # HF, Ray and the conversions
    python benchmarks/peers.py --rows 200000 --token-rows 20000 --repeat 1
    python benchmarks/peers.py --only ours,lance --json peers.json
    python benchmarks/peers.py --skip-setup     # do not run peers/setup.sh
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import resource
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.parquet as pq

from throughput import _raw_convert, make_tabular, make_tokens, shuffled_batches  # this folder

HERE = Path(__file__).resolve().parent
DATA = HERE / ".data"
WORK = DATA / "peers"  # the peers' converted copies (Lance, HF's Arrow cache, MDS, LitData)
PEERS = HERE / "peers"
PEERS_VENV = PEERS / ".venv"  # ignored by the repository's `.venv/` pattern
BATCH_SIZE = 1024
EPOCHS = 2  # the last is timed
SEED = 7
BLOCK_BYTES = 64 << 20  # ours' default shuffle_block_bytes: Ray's local buffer holds as much
NA = "-"
# Every peer: its virtualenv (.venv/<package>) and its configurations (name, notes).
PEER_PACKAGES = {
    "lance": "pylance",
    "ray": "ray",
    "hf": "datasets",
    "streaming": "mosaicml-streaming",
    "litdata": "litdata",
    "petastorm": "petastorm",
    "daft": "daft",
}
PREPARED = ("lance", "hf", "streaming", "litdata")  # those that convert the data once
# Why a peer cannot install here, where pip's quiet output says only that pins conflict.
INSTALL_NOTES = {
    "petastorm": "petastorm 0.13.1 pins setuptools<70 and torch 2.13 needs setuptools>=77.0.3; "
    "its reader also calls pyarrow's legacy ParquetDataset(validate_schema=, metadata_nthreads=), "
    "gone since pyarrow 15",
}

# --- measuring (shared with peers/run.py, which runs in the peers' virtualenvs) ---------------


def describe(batch: Mapping[str, Any]) -> str:
    """A batch's layout, column by column: ``name: float32 [1024, 64]``, ``list of str``..."""
    parts = []
    for name, value in batch.items():
        if hasattr(value, "dtype") and hasattr(value, "shape"):
            kind = f"{str(value.dtype).removeprefix('torch.')} {list(value.shape)}"
        elif isinstance(value, list):
            inner = type(value[0]).__name__ if value else "?"
            kind = f"list of {len(value)} {inner}"
        else:
            kind = type(value).__name__
        parts.append(f"{name}: {kind}")
    return "; ".join(parts)


def ids_of(batch: Mapping[str, Any]) -> np.ndarray:
    """The batch's ids as int64 numpy (a tensor, an array, or a list of either)."""
    ids = batch["id"]
    parts = ids if isinstance(ids, list) else [ids]
    arrays = [np.asarray(i.numpy() if hasattr(i, "numpy") else i).reshape(-1) for i in parts]
    return np.concatenate(arrays).astype(np.int64)  # a copy: the batch's memory may be reused


def check_ids(ids: Sequence[np.ndarray], rows: int) -> str:
    """'' when the epoch delivered each id of ``range(rows)`` exactly once, else what it did."""
    every = np.concatenate(ids) if ids else np.zeros(0, np.int64)
    outside = int(((every < 0) | (every >= rows)).sum())
    counts = np.bincount(every[(every >= 0) & (every < rows)], minlength=rows)
    missing, repeated = int((counts == 0).sum()), int((counts > 1).sum())
    if not (outside or missing or repeated):
        return ""
    said = [f"{n:,} {what}" for n, what in ((missing, "missing"), (repeated, "repeated")) if n]
    return ", ".join(said + ([f"{outside:,} ids out of range"] if outside else []))


def measure(
    build: Callable[[], Any],
    epoch: Callable[[Any, int], Iterable[Mapping[str, Any]]],
    *,
    rows: int,
    epochs: int = EPOCHS,
) -> dict[str, Any]:
    """Build a loader (``build()``) and read ``epochs`` epochs of it (``epoch(loader, e)``),
    keeping every batch's ids.

    Returns:
        ``rows`` and ``seconds`` of the last (warm) epoch and ``rows_per_s``, ``first_batch_s``
        (from before ``build`` to the first epoch's first batch), ``setup_s`` (``build`` alone),
        ``format`` (the first batch's layout), ``ids`` (each epoch's id check, '' when every id
        came once) and ``rss_self_mb`` (this process's peak RSS).
    """
    start = time.perf_counter()
    loader = build()
    setup = time.perf_counter() - start
    first = float("nan")
    layout = ""
    checks: list[str] = []
    delivered = 0
    seconds = 0.0
    for e in range(epochs):
        if e:
            start = time.perf_counter()
        ids: list[np.ndarray] = []
        for batch in epoch(loader, e):
            if not ids and not e:
                first = time.perf_counter() - start
                layout = describe(batch)
            ids.append(ids_of(batch))
        seconds = time.perf_counter() - start
        delivered = sum(len(i) for i in ids)
        checks.append(check_ids(ids, rows))
    return {
        "rows": delivered,
        "seconds": seconds,
        "rows_per_s": delivered / seconds if seconds > 0 else 0.0,
        "first_batch_s": first,
        "setup_s": setup,
        "format": layout,
        "ids": checks,
        "rss_self_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    }


# --- ours and the limits, in this virtualenv ---------------------------------------------------


def run_ours(spec: Mapping[str, Any]) -> dict[str, Any]:
    """One configuration of ours (``kind`` ``ours``) or of a limit (``raw-shuffled``, ``raw``,
    ``raw-threads``), in this process."""
    import torch  # noqa: F401  (imported before timing, as a training script would)

    data = Path(spec["data"])
    kind = spec["kind"]
    if kind == "raw-shuffled":
        files = sorted(str(p) for p in data.glob("*.parquet"))
        rng = np.random.default_rng(SEED)

        def shuffled_epoch(loader: None, e: int) -> Iterable[Mapping[str, Any]]:
            for batch in shuffled_batches(files, BATCH_SIZE, rng):
                yield _raw_convert(batch)

        return measure(lambda: None, shuffled_epoch, rows=spec["rows"])
    if kind.startswith("raw"):
        files = sorted(str(p) for p in data.glob("*.parquet"))
        threads = kind == "raw-threads"

        def raw_epoch(loader: None, e: int) -> Iterable[Mapping[str, Any]]:
            for path in files:
                reader = pq.ParquetFile(path)
                for batch in reader.iter_batches(batch_size=BATCH_SIZE, use_threads=threads):
                    yield _raw_convert(batch)

        return measure(lambda: None, raw_epoch, rows=spec["rows"])

    import torch_dataloader_utils as tdu

    workers = spec["workers"]

    def build() -> Any:
        return tdu.create_dataloader(
            str(data),
            batch_size=BATCH_SIZE,
            shuffle=True,
            num_workers=workers,
            persistent_workers=workers > 0,
            list_format=spec["list_format"],
        )

    def epoch(loader: Any, e: int) -> Iterable[Mapping[str, Any]]:
        loader.set_epoch(e)
        return loader  # type: ignore[no-any-return]

    return measure(build, epoch, rows=spec["rows"])


# --- running a configuration -----------------------------------------------------------------


class TreeMemory:
    """Samples the summed RSS and PSS of a process and its descendants every ``interval`` s, in
    a thread of this process, and can end the descendants it saw that outlive the process."""

    def __init__(self, pid: int, interval: float = 0.1) -> None:
        import psutil

        self.psutil = psutil
        self.root = psutil.Process(pid)
        self.interval = interval
        self.rss = self.pss = 0
        self.seen: dict[int, Any] = {}
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        psutil = self.psutil
        while not self.done.is_set():
            try:
                procs = [self.root, *self.root.children(recursive=True)]
            except psutil.Error:
                break
            rss = pss = 0
            for p in procs:
                self.seen.setdefault(p.pid, p)
                try:
                    info = p.memory_full_info()
                except psutil.Error:
                    continue
                rss += info.rss
                pss += getattr(info, "pss", info.rss)
            self.rss, self.pss = max(self.rss, rss), max(self.pss, pss)
            self.done.wait(self.interval)

    def stop(self) -> None:
        """Stop sampling; end (by pid, checked against its start time) any descendant seen that
        is still alive, such as a Ray process left behind by a run that failed."""
        self.done.set()
        self.thread.join()
        for pid, p in self.seen.items():
            if pid != self.root.pid and p.is_running():
                with contextlib.suppress(self.psutil.Error):
                    p.kill()


def run_config(cmd: Sequence[str], env: Mapping[str, str], timeout: float) -> dict[str, Any]:
    """Run ``cmd`` (its last line of stdout is a JSON object) while sampling its process tree's
    memory; adds ``rss_mb`` and ``pss_mb``. A failure comes back as ``{"error": ...}``."""
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        child = subprocess.Popen(cmd, stdout=out, stderr=err, env=dict(env), text=True)
        memory = TreeMemory(child.pid)
        try:
            code = child.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            child.kill()
            code = child.wait()
            err.write(f"\ntimed out after {timeout:.0f} s")
        memory.stop()
        out.seek(0)
        err.seek(0)
        lines = out.read().strip().splitlines()
        if code or not lines:
            said = [line.strip() for line in err.read().splitlines() if line.strip()]
            return {"error": f"exit {code}: {said[-1][:300] if said else 'no output'}"}
    result: dict[str, Any] = json.loads(lines[-1])
    result["rss_mb"] = max(memory.rss / 2**20, result.get("rss_self_mb", 0.0))
    result["pss_mb"] = memory.pss / 2**20
    return result


def peer_python(peer: str, *, setup: bool) -> tuple[str | None, str]:
    """The python of ``peer``'s virtualenv (made by peers/setup.sh when missing and ``setup``),
    and its versions; or None and why it cannot run."""
    package = PEER_PACKAGES[peer]
    python = PEERS_VENV / package / "bin" / "python"
    failed = PEERS_VENV / f"failed-{package}.txt"  # setup.sh's note of a failed install
    if failed.exists():
        errors = [line for line in failed.read_text().splitlines() if line.startswith("ERROR")]
        said = [e for e in errors if "ResolutionImpossible" not in e] or errors
        note = f" ({INSTALL_NOTES[peer]})" if peer in INSTALL_NOTES else ""
        return None, f"did not install: {' / '.join(said[-2:])}{note}"
    if not python.exists():
        how = "run bash benchmarks/peers/setup.sh" if not setup else "setup.sh made none"
        return None, f"no virtualenv ({how})"
    check = [str(python), str(PEERS / "run.py"), "--check", peer]
    done = subprocess.run(check, capture_output=True, text=True, check=False)
    if done.returncode:
        return None, "cannot import: " + " / ".join(done.stderr.strip().splitlines()[-2:])
    return str(python), done.stdout.strip()


def peer_env() -> dict[str, str]:
    """The environment of a peer's run: offline, no telemetry, no progress bars."""
    return {
        **os.environ,
        "HF_HUB_OFFLINE": "1",
        "HF_DATASETS_OFFLINE": "1",
        "HF_DATASETS_DISABLE_PROGRESS_BARS": "1",
        "RAY_USAGE_STATS_ENABLED": "0",
        "RAY_DEDUP_LOGS": "0",
        "TOKENIZERS_PARALLELISM": "false",
    }


# --- the plan --------------------------------------------------------------------------------


@dataclass
class Config:
    """One row of a table."""

    name: str
    group: str  # limit, ours or a peer (PEER_PACKAGES)
    spec: dict[str, Any]
    note: str  # the shuffle and the batch layout, as the table says them


def plan(tokens: bool, only: set[str]) -> list[Config]:
    """Every configuration of one dataset, in the table's order."""
    configs = [
        Config(
            "raw pyarrow, shuffled", "limit", {"kind": "raw-shuffled"}, "64 MiB blocks permuted"
        ),
        Config("raw pyarrow", "limit", {"kind": "raw"}, "no shuffle, 1 thread"),
        Config("raw pyarrow, threads", "limit", {"kind": "raw-threads"}, "no shuffle, threads"),
    ]
    formats = ["padded", "offsets"] if tokens else ["padded"]
    for list_format in formats if "ours" in only else []:
        for w in (0, 2):
            name = f"ours {list_format}, w{w}" if tokens else f"ours, w{w}"
            spec = {"kind": "ours", "workers": w, "list_format": list_format}
            configs.append(Config(name, "ours", spec, "row groups + 64 MiB block shuffle"))
    peers = [
        ("lance", "Lance scan", {"mode": "scan"}, "1024-row ranges shuffled", (0, 2)),
        ("lance", "Lance take", {"mode": "take"}, "full row permutation", (0, 2)),
        ("ray", "Ray local buffer", {"mode": "local"}, "block order + local buffer", (None,)),
        ("ray", "Ray random_shuffle", {"mode": "full"}, "global random_shuffle", (None,)),
    ]
    if tokens:  # HF's own batch format for the lists, and padded in the worker, as ours
        peers += [
            ("hf", "HF list", {}, "full row permutation", (0, 2)),
            ("hf", "HF padded", {"pad": True}, "full row permutation", (0, 2)),
        ]
    else:
        peers.append(("hf", "HF datasets", {}, "full row permutation", (0, 2)))
    peers += [
        ("streaming", "Streaming", {}, "py1e: shards + rows in a window", (0, 2)),
        ("litdata", "LitData", {}, "chunk order + rows within chunks", (0, 2)),
        ("petastorm", "Petastorm", {}, "row groups + shuffling queue", (None,)),
        ("daft", "Daft to_torch", {"mode": "torch"}, "full permutation (shuffle)", (None,)),
        ("daft", "Daft arrow", {"mode": "arrow"}, "full permutation (shuffle)", (None,)),
    ]
    for group, label, spec, note, workers in peers:
        if group not in only:
            continue
        for w in workers:
            name = label if w is None else f"{label}, w{w}"
            configs.append(Config(name, group, {"peer": group, **spec, "workers": w}, note))
    return configs


def decoded_row_bytes(data: Path) -> float:
    """Decoded Arrow bytes per row of the first row group."""
    first = pq.ParquetFile(sorted(data.glob("*.parquet"))[0]).read_row_group(0)
    return float(first.nbytes / first.num_rows)


def prepare(peer: str, python: str, data: Path, timeout: float) -> tuple[str, str]:
    """A peer's one-off conversion of ``data`` (Lance, HF's Arrow cache, MDS, LitData), cached under
    ``WORK``; returns a note of its time ('' when cached) and an error ('' when none)."""
    cmd = [python, str(PEERS / "run.py"), "--prepare", peer, "--data", str(data)]
    cmd += ["--work", str(WORK)]
    result = run_config(cmd, peer_env(), timeout)
    if "error" in result:
        return "", result["error"]
    seconds = result.get("seconds")
    return (f"{peer} {data.name}: {result['what']} in {seconds:.1f} s" if seconds else ""), ""


# --- report ----------------------------------------------------------------------------------


def short_format(layout: str, tokens: bool) -> str:
    """The part of a batch's layout the notes show: the list column of tokens, the string and
    embedding of tabular."""
    keep = ("tokens", "tokens_offsets") if tokens else ("s", "emb")
    parts = [p for p in layout.split("; ") if p.split(":")[0] in keep]
    return "; ".join(parts)


def ratio(a: float, b: float) -> str:
    if not (a and b):
        return NA
    return f"{a / b:.2f}" if a / b >= 0.1 else f"{a / b:.3f}"


def table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> None:
    print("| " + " | ".join(header) + " |")
    print("|:--|" + "|".join("--:" for _ in header[1:-1]) + "|:--|")
    for row in rows:
        print("| " + " | ".join(row) + " |")
    print(flush=True)


def report_rows(
    configs: Sequence[Config], results: Mapping[str, Mapping[str, Any]], tokens: bool
) -> tuple[list[list[str]], float, float]:
    """The table's rows, the shuffled limit and the unshuffled one (rows/s)."""

    def best(kinds: Sequence[str]) -> float:
        rates = [
            r["rows_per_s"]
            for c in configs
            if c.spec.get("kind") in kinds and "error" not in (r := results[c.name])
        ]
        return max(rates, default=0.0)

    shuffled, raw = best(["raw-shuffled"]), best(["raw", "raw-threads"])
    out = []
    for c in configs:
        r = results[c.name]
        if "error" in r:
            out.append([c.name, NA, NA, NA, NA, NA, f"not available: {r['error']}"])
            continue
        notes = [c.note, short_format(r.get("format", ""), tokens)]
        notes += [f"epoch {e + 1} ids: {said}" for e, said in enumerate(r["ids"]) if said]
        notes += [r["note"]] if r.get("note") else []
        out.append(
            [
                c.name,
                f"{r['rows_per_s']:,.0f}",
                ratio(r["rows_per_s"], shuffled),
                ratio(r["rows_per_s"], raw),
                f"{r['first_batch_s']:.2f}",
                f"{r['rss_mb']:,.0f} / {r['pss_mb']:,.0f}",
                "; ".join(n for n in notes if n),
            ]
        )
    return out, shuffled, raw


# --- main ------------------------------------------------------------------------------------


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=2_000_000, help="rows of tabular")
    parser.add_argument("--token-rows", type=int, default=125_000, help="rows of tokens")
    parser.add_argument("--repeat", type=int, default=1, help="runs per config; best is kept")
    parser.add_argument(
        "--only",
        default=",".join(["ours", *PEER_PACKAGES]),
        help=f"comma-separated of ours, {', '.join(PEER_PACKAGES)}",
    )
    parser.add_argument(
        "--datasets",
        default="tabular,narrow,tokens",
        help="comma-separated of tabular, narrow (issue 47's second shape), tokens",
    )
    parser.add_argument("--skip-setup", action="store_true", help="do not run peers/setup.sh")
    parser.add_argument("--timeout", type=float, default=1800, help="seconds a run, at most")
    parser.add_argument("--json", help="write the results to this file")
    parser.add_argument("--one", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        print(json.dumps(run_ours(json.loads(args.one))))
        return
    only = {name.strip() for name in args.only.split(",") if name.strip()}
    unknown = only - {"ours", *PEER_PACKAGES}
    if unknown:
        parser.error(f"--only: unknown {', '.join(sorted(unknown))}")

    import torch

    print(
        f"Python {platform.python_version()}, torch {torch.__version__}, {os.cpu_count()} CPUs; "
        f"batch size {BATCH_SIZE}, {EPOCHS} epochs a run (the last timed), best of {args.repeat}"
    )
    makers = {
        "tabular": lambda: (make_tabular(DATA, args.rows), False),
        "narrow": lambda: (make_tabular(DATA, args.rows, narrow=True), False),
        "tokens": lambda: (make_tokens(DATA, args.token_rows), True),
    }
    chosen = [name.strip() for name in args.datasets.split(",") if name.strip()]
    if set(chosen) - set(makers):
        parser.error(f"--datasets: unknown {', '.join(sorted(set(chosen) - set(makers)))}")
    datasets = [(name, *makers[name]()) for name in chosen]
    peers: dict[str, tuple[str | None, str]] = {}
    wanted = [p for p in PEER_PACKAGES if p in only]
    if wanted and not args.skip_setup:
        print("peers/setup.sh (installs what is missing) ...", flush=True)
        subprocess.run(["bash", str(PEERS / "setup.sh")], capture_output=True, check=False)
    for peer in wanted:
        peers[peer] = peer_python(peer, setup=not args.skip_setup)
        print(f"{peer}: {peers[peer][1]}")
    prepared: list[str] = []
    for peer in PREPARED:
        python = peers.get(peer, (None, ""))[0]
        for _, data, _ in datasets if python else []:
            said, error = prepare(peer, python, data, args.timeout)  # type: ignore[arg-type]
            prepared += [said] if said else []
            if error:  # its rows say why
                peers[peer] = (None, f"conversion failed: {error}")
    print()

    out: dict[str, Any] = {"args": vars(args), "prepared": prepared, "datasets": {}}
    out["peers"] = {p: said for p, (_, said) in peers.items()}
    for label, data, tokens in datasets:
        rows = pq.ParquetDataset(str(data)).read(columns=["id"]).num_rows
        row_bytes = decoded_row_bytes(data)
        buffer_rows = max(BATCH_SIZE, int(BLOCK_BYTES / row_bytes))
        configs = plan(tokens, only)
        results: dict[str, dict[str, Any]] = {}
        for c in configs:
            spec = {**c.spec, "data": str(data), "rows": rows, "work": str(WORK)}
            if c.group in ("limit", "ours"):
                cmd, env = [sys.executable, __file__, "--one", json.dumps(spec)], dict(os.environ)
            else:
                python, said = peers[c.group]
                if python is None:
                    results[c.name] = {"error": said}
                    continue
                spec["buffer_rows"] = buffer_rows
                cmd = [python, str(PEERS / "run.py"), "--spec", json.dumps(spec)]
                env = peer_env()
            runs = [run_config(cmd, env, args.timeout) for _ in range(max(1, args.repeat))]
            good = [r for r in runs if "error" not in r]
            results[c.name] = max(good, key=lambda r: r["rows_per_s"]) if good else runs[-1]
        print(
            f"## {label}: {rows:,} rows, {row_bytes:.0f} decoded bytes a row "
            f"({data.relative_to(HERE)}; Ray's local buffer {buffer_rows:,} rows)\n"
        )
        lines, shuffled, raw = report_rows(configs, results, tokens)
        header = ["config", "rows/s", "x shuffled", "x raw", "first batch s", "RSS / PSS MB"]
        table([*header, "notes"], lines)
        out["datasets"][label] = {
            "data": str(data),
            "rows": rows,
            "decoded_row_bytes": row_bytes,
            "shuffled_limit_rows_per_s": shuffled,
            "raw_limit_rows_per_s": raw,
            "configs": [
                {
                    "name": c.name,
                    "group": c.group,
                    "spec": c.spec,
                    **results[c.name],  # its "note" is the run's (Ray's init time)
                    "shuffle": c.note,
                }
                for c in configs
            ],
        }
    for said in prepared:
        print(f"one-off conversion (not in any epoch): {said}")
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=2) + "\n")
        print(f"results written to {args.json}")


if __name__ == "__main__":
    main()
