"""Mixtures: each batch's source shares, each epoch's quotas and throughput, against one source,
raw pyarrow and the peers (HF ``datasets``, MosaicML Streaming), measured in the same run.

Data (written once under ``benchmarks/.data``): three local Parquet sources of different sizes
and row widths (``--rows``, default 400k/150k/50k; several files and row groups each), columns
an ``int64`` ``id`` unique across sources (source ``k`` holds ``[bounds[k], bounds[k + 1])``, so
every row's source is known from its id), ``x`` (16 float32) and ``tokens`` (a ``list<int32>``
of 16-64, 96-160 and 8-24 ids by source). A fourth directory holds hard links to all the files:
the same rows as ONE source.

Configurations, each in its own subprocess, ``--epochs`` epochs (default 2; each after the
first is timed, warm, the fastest kept; every epoch is checked), for each batch size
(``--batch-sizes``, default 32 and 1024) and ``num_workers`` (``--workers``, default 0 and 2,
persistent); ours and raw pyarrow in ``--rounds`` interleaved rounds (default 3), each
configuration's fastest kept:

- ours: ``create_dataloader([tdu.Source(dir, weight=w) ...], epoch_rows=...,
  mixing="random" | "stratified", source_column="source", shuffle=True)``, weights 5:3:2 and
  300k rows an epoch by default (so the smallest source repeats and the largest is subsampled);
- one source: ``create_dataloader(all_dir, shuffle=True)``, every row once an epoch;
- raw pyarrow: ``pyarrow.dataset`` over all the files, ``to_batches`` + zero-copy torch, one
  process, no shuffle: the yardstick for rows/s;
- peers, each in its own virtualenv under ``benchmarks/peers_mixing/.venv/`` (made by
  ``setup.sh`` there on the first run), over the same Parquet files: HF
  ``interleave_datasets(probabilities=..., stopping_strategy="all_exhausted")`` over
  ``load_dataset("parquet")``, and MosaicML Streaming ``StreamingDataset(streams=[Stream(
  local=..., proportion=...)], epoch_size=..., batching_method="random" | "stratified")`` over
  the files converted with ``MDSWriter`` (see ``peers_mixing/run.py``).

Columns: ``MAD of shares`` is the mean over full batches of the mean absolute deviation of the
batch's source shares from the weights; ``max dev`` the largest deviation of one source's rows
in one batch from ``batch_size * weight``; ``epoch exact`` whether every epoch held each
source's quota (``round(epoch_rows * w / sum(w))``, largest remainders), with the last epoch's
rows per source; ``once before twice`` whether, by ids, each source's rows were delivered
``floor(n/N)`` or ``floor(n/N) + 1`` times over the epochs (``n`` rows of its ``N`` delivered;
else the sources that were not). For ours both must hold: the script exits non-zero otherwise.
``rows/s`` is the timed epoch's after its first batch, ``1st batch s`` its time to the first
batch; the raw and one-source runs read every row, the mixtures ``epoch_rows`` (the mean decoded
row width of both is printed: close by design). The peers' epochs are shorter
(``--hf-epoch-rows``, default a tenth of ``epoch_rows``; ``--streaming-epoch-rows``, a 50th): at
their speed here full epochs would take most of an hour.

Usage::

    python benchmarks/mixing.py                       # ~5 minutes on 2 cores (peers included)
    python benchmarks/mixing.py --scale 0.25          # a quarter of the rows
    python benchmarks/mixing.py --no-peers --batch-sizes 1024
    python benchmarks/mixing.py --rows 800000,300000,100000 --epoch-rows 600000
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

HERE = Path(__file__).resolve().parent
DATA = HERE / ".data"
PEERS = HERE / "peers_mixing"
PEERS_VENV = PEERS / ".venv"  # ignored by the repository's `.venv/` pattern
TOKENS = ((16, 64), (96, 160), (8, 24))  # token-list lengths of each source, inclusive
WIDTH = 16  # floats in x
SEED = 7
NA = "-"  # a cell with nothing to say

# --- data ---------------------------------------------------------------------------------------


def make_sources(root: Path, sizes: Sequence[int]) -> tuple[list[Path], Path]:
    """The sources' directories (``root/src{k}``) and one directory of hard links to all their
    files (``root/all``); written once. Files of up to 100k rows, row groups of 20k rows."""
    out = root / ("mixing-" + "-".join(str(n) for n in sizes))
    dirs = [out / f"src{k}" for k in range(len(sizes))]
    every = out / "all"
    if (out / "_done").exists():
        return dirs, every
    every.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(SEED)
    start = 0
    for k, (rows, directory) in enumerate(zip(sizes, dirs, strict=True)):
        directory.mkdir(parents=True, exist_ok=True)
        low, high = TOKENS[k % len(TOKENS)]
        files = max(2, math.ceil(rows / 100_000))
        for f, part in enumerate(np.array_split(np.arange(start, start + rows), files)):
            n = len(part)
            lengths = rng.integers(low, high + 1, n)
            offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
            values = rng.integers(0, 50_000, int(offsets[-1]), dtype=np.int32)
            x = rng.random(n * WIDTH, dtype=np.float32)
            table = pa.table(
                {
                    "id": pa.array(part.astype(np.int64)),
                    "x": pa.FixedSizeListArray.from_arrays(pa.array(x), WIDTH),
                    "tokens": pa.ListArray.from_arrays(pa.array(offsets), pa.array(values)),
                }
            )
            path = directory / f"part-{f:03d}.parquet"
            pq.write_table(table, path, row_group_size=20_000)
            link = every / f"src{k}-{path.name}"
            link.unlink(missing_ok=True)
            try:
                os.link(path, link)
            except OSError:  # another filesystem: a copy reads the same
                link.write_bytes(path.read_bytes())
        start += rows
    (out / "_done").touch()
    return dirs, every


def quotas(epoch_rows: int, weights: Sequence[float]) -> list[int]:
    """Each source's rows an epoch: ``epoch_rows`` split by the weights, largest remainders
    (ties to the earlier source), as docs/concepts/mixtures.md says."""
    total = sum(weights)
    exact = [epoch_rows * w / total for w in weights]
    out = [math.floor(e) for e in exact]
    order = sorted(range(len(weights)), key=lambda i: (-(exact[i] - out[i]), i))
    for i in order[: epoch_rows - sum(out)]:
        out[i] += 1
    return out


# --- measuring (shared with peers_mixing/run.py, which runs in the peers' virtualenv) -------------


def measure(
    epoch: Callable[[int], Iterable[Mapping[str, Any]]], *, epochs: int, bounds: Sequence[int]
) -> dict[str, Any]:
    """Read ``epochs`` epochs (``epoch(e)`` yields epoch ``e``'s batches) keeping each batch's
    ids (and ``source`` column when there is one); each epoch after the first is timed (the
    only one, if one), the fastest kept: one epoch's time moves 10-20% from run to run here.

    Returns:
        ``rows`` and ``seconds`` of the fastest timed epoch, ``first_batch_s`` (its time to the
        first batch) and ``first_rows`` (that batch's rows), ``batch_counts`` (the last
        epoch's rows of each source, per batch), ``epoch_counts`` (each epoch's rows of each
        source) and ``repeats`` (for each source, the fewest and the most times one of its rows
        was delivered over all the epochs).

    Raises:
        AssertionError: a batch's ``source`` column disagrees with its ids.
    """
    edges = np.asarray(bounds, dtype=np.int64)
    sources = len(edges) - 1
    seen = [np.zeros(int(edges[k + 1] - edges[k]), np.int64) for k in range(sources)]
    epoch_counts: list[list[int]] = []
    batch_counts: list[list[int]] = []
    rows = first_rows = 0
    seconds = first = 0.0
    timed: dict[str, Any] = {}
    for e in range(epochs):
        ids: list[np.ndarray] = []
        labels: list[np.ndarray] = []
        start = time.perf_counter()
        for batch in epoch(e):
            if not ids:
                first = time.perf_counter() - start
            ids.append(np.asarray(batch["id"]).copy())
            if len(ids) == 1:
                first_rows = len(ids[0])
            if "source" in batch:
                labels.append(np.asarray(batch["source"]).copy())
        seconds = time.perf_counter() - start
        if (e or epochs == 1) and (not timed or seconds < timed["seconds"]):
            timed = {"seconds": seconds, "first_batch_s": first, "first_rows": first_rows}
        of = [np.searchsorted(edges, i, side="right") - 1 for i in ids]
        if labels:
            for got, want in zip(labels, of, strict=True):
                assert np.array_equal(got, want), "the source column disagrees with the ids"
        every = np.concatenate(ids) if ids else np.zeros(0, np.int64)
        which = np.concatenate(of) if of else np.zeros(0, np.int64)
        assert ((which >= 0) & (which < sources)).all(), "an id outside every source"
        epoch_counts.append(np.bincount(which, minlength=sources).tolist())
        for k in range(sources):
            seen[k] += np.bincount(every[which == k] - edges[k], minlength=len(seen[k]))
        batch_counts = [np.bincount(s, minlength=sources).tolist() for s in of]
        rows = len(every)
    return {
        "rows": rows,
        **timed,
        "batch_counts": batch_counts,
        "epoch_counts": epoch_counts,
        "repeats": [[int(s.min()), int(s.max())] if len(s) else [0, 0] for s in seen],
    }


def run_ours(kind: str, spec: Mapping[str, Any]) -> dict[str, Any]:
    """One configuration of ours or raw pyarrow, in this process (``kind``: ``raw``,
    ``one-w{n}``, ``random-w{n}``, ``stratified-w{n}``)."""
    import torch  # imported before timing, as a training script would

    batch_size = spec["batch_size"]
    if kind == "raw":
        import pyarrow.dataset as ds

        dataset = ds.dataset(spec["all"], format="parquet")

        def convert(batch: pa.RecordBatch) -> dict[str, Any]:
            tokens = batch.column("tokens")
            offsets = tokens.offsets.to_numpy()
            return {
                "id": torch.from_dlpack(batch.column("id")),
                "x": torch.from_dlpack(batch.column("x").flatten()).view(-1, WIDTH),
                "tokens": torch.from_dlpack(tokens.flatten()),
                "tokens_offsets": torch.from_numpy(offsets - offsets[0]),
            }

        def raw_epoch(e: int) -> Iterable[Mapping[str, Any]]:
            for batch in dataset.to_batches(batch_size=batch_size):
                if batch.num_rows:
                    yield convert(batch)

        return measure(raw_epoch, epochs=spec["epochs"], bounds=spec["bounds"])

    import torch_dataloader_utils as tdu

    how, workers = kind.rsplit("-w", 1)
    options: dict[str, Any] = {
        "batch_size": batch_size,
        "shuffle": True,
        "num_workers": int(workers),
        "persistent_workers": int(workers) > 0,
    }
    if how == "one":
        loader = tdu.create_dataloader(spec["all"], **options)
    else:
        sources = [
            tdu.Source(path, weight=w)
            for path, w in zip(spec["dirs"], spec["weights"], strict=True)
        ]
        loader = tdu.create_dataloader(
            sources,
            epoch_rows=spec["epoch_rows"],
            mixing=how,
            source_column="source",
            **options,
        )

    def epoch(e: int) -> Iterable[Mapping[str, Any]]:
        loader.set_epoch(e)
        return loader

    return measure(epoch, epochs=spec["epochs"], bounds=spec["bounds"])


def subprocess_json(cmd: Sequence[str], *, env: Mapping[str, str] | None = None) -> dict[str, Any]:
    """Run ``cmd``; its last line of stdout is a JSON object. A failure comes back as
    ``{"error": ...}`` (the end of its stderr)."""
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, check=False)
    lines = done.stdout.strip().splitlines()
    if done.returncode or not lines:
        tail = (done.stderr or done.stdout).strip().splitlines()[-6:]
        return {"error": f"exit {done.returncode}: " + " / ".join(tail)}
    result: dict[str, Any] = json.loads(lines[-1])
    return result


# --- peers ----------------------------------------------------------------------------------------


# (package, key, [(label, mixing)]): each peer in its own virtualenv, .venv/<package>.
PEER_RUNS = (
    ("datasets", "hf", [("HF interleave_datasets", "random")]),
    (
        "mosaicml-streaming",
        "streaming",
        [("Streaming random", "random"), ("Streaming stratified", "stratified")],
    ),
)
# The peers' epochs are shorter by default (--hf-epoch-rows, --streaming-epoch-rows): at their
# speed here full epochs would take most of an hour. Per-batch shares do not depend on it.
PEER_EPOCH_DIVISOR = {"hf": 10, "streaming": 50}


def peer_python(package: str, peer: str, *, setup: bool) -> tuple[str | None, str]:
    """The python of ``package``'s virtualenv (made by peers_mixing/setup.sh when missing and
    ``setup``), or None and why it cannot run."""
    python = PEERS_VENV / package / "bin" / "python"
    failed = PEERS_VENV / f"failed-{package}.txt"  # setup.sh's note of a failed install
    if not (PEERS_VENV / package / ".installed").exists() and setup and not failed.exists():
        print(f"setting up {package}'s virtualenv (peers_mixing/setup.sh) ...", flush=True)
        subprocess.run(["bash", str(PEERS / "setup.sh")], capture_output=True, check=False)
    if failed.exists():
        return None, "did not install: " + " / ".join(failed.read_text().strip().splitlines()[-3:])
    if not python.exists():
        return None, "no virtualenv: run bash benchmarks/peers_mixing/setup.sh"
    check = [str(python), str(PEERS / "run.py"), "--peer", peer, "--check"]
    done = subprocess.run(check, capture_output=True, text=True, check=False)
    if done.returncode:
        return None, "cannot import: " + " / ".join(done.stderr.strip().splitlines()[-2:])
    return str(python), done.stdout.strip()


# --- report ---------------------------------------------------------------------------------------


def shares(
    counts: Sequence[Sequence[int]], weights: Sequence[float], batch_size: int
) -> tuple[float, float]:
    """Mean over full batches of the mean absolute deviation of the shares from the weights,
    and the largest deviation in rows of one source in one batch."""
    c = np.asarray(counts, dtype=np.float64).reshape(-1, len(weights))
    c = c[c.sum(axis=1) == batch_size]
    if not len(c):
        return float("nan"), float("nan")
    w = np.asarray(weights, dtype=np.float64) / sum(weights)
    mad = float(np.abs(c / batch_size - w).mean(axis=1).mean())
    return mad, float(np.abs(c - batch_size * w).max())


def uneven(result: Mapping[str, Any], want: Sequence[int], sizes: Sequence[int]) -> list[str]:
    """The sources whose rows were not each delivered ``floor(n/N)`` or ``floor(n/N) + 1``
    times over the epochs (``n`` of its ``N`` rows delivered: ``want`` an epoch), and how."""
    problems = []
    epochs = len(result["epoch_counts"])
    for k, ((low, high), q, size) in enumerate(zip(result["repeats"], want, sizes, strict=True)):
        n = epochs * q
        floor = n // size
        top = floor + (1 if n % size else 0)
        if low < floor or high > top:
            problems.append(
                f"source {k}: rows delivered {low}..{high} times after {n:,} of {size:,}, "
                f"expected {floor}..{top}"
            )
    return problems


def table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> None:
    print("| " + " | ".join(header) + " |")
    print("|:--|" + "|".join("--:" for _ in header[1:]) + "|")
    for row in rows:
        print("| " + " | ".join(row) + " |")
    print(flush=True)


def ratio(a: float | None, b: float | None) -> str:
    if not (a and b):
        return NA
    return f"{a / b:.2f}" if a / b >= 0.1 else f"{a / b:.3f}"


def mean_row_bytes(dirs: Sequence[Path], rows: Sequence[float]) -> float:
    """Decoded bytes per row of a read holding ``rows[k]`` rows of source ``k``."""
    per = []
    for d in dirs:
        first = pq.read_table(sorted(d.glob("*.parquet"))[0])
        per.append(first.nbytes / first.num_rows)
    return float(np.dot(per, rows) / sum(rows))


# --- main -----------------------------------------------------------------------------------------


@dataclass
class Run:
    """One row of a table: how to run it and what to check it against."""

    kind: str  # raw, one-w{n}, {random,stratified}-w{n}, {hf,streaming}-{mixing}-w{n}
    label: str
    cmd: list[str] = field(default_factory=list)
    env: dict[str, str] | None = None
    want: list[int] | None = None  # each source's quota; None: every row once
    error: str = ""  # why it cannot run

    @property
    def workers(self) -> str | None:
        return self.kind.rsplit("-w", 1)[1] if "-w" in self.kind else None


def plan_runs(
    args: argparse.Namespace, spec: dict[str, Any], peers: Mapping[str, tuple[str, int, str]]
) -> list[Run]:
    """Every configuration of one batch size, in the order of the table. ``peers``: each peer's
    python, rows an epoch and why it cannot run ('' when it can)."""
    workers = [int(w) for w in args.workers.split(",")]
    mine = [sys.executable, __file__, "--spec", json.dumps(spec), "--one"]
    want = quotas(spec["epoch_rows"], spec["weights"])
    runs = [
        Run(f"{m}-w{w}", f"ours {m}, w{w}", [*mine, f"{m}-w{w}"], want=want)
        for m in ("random", "stratified")
        for w in workers
    ]
    runs += [Run(f"one-w{w}", f"one source (tdu), w{w}", [*mine, f"one-w{w}"]) for w in workers]
    runs.append(Run("raw", "raw pyarrow", [*mine, "raw"]))
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    for _, peer, labels in PEER_RUNS:
        if peer not in peers:
            continue
        python, rows, error = peers[peer]
        for label, mixing in labels:
            for w in workers:
                theirs = {
                    **spec,
                    "epoch_rows": rows,
                    "mixing": mixing,
                    "workers": w,
                    "work": str(Path(spec["all"]).parent),
                }
                cmd = [python, str(PEERS / "run.py"), "--peer", peer, "--spec", json.dumps(theirs)]
                want = quotas(rows, spec["weights"])
                runs.append(Run(f"{peer}-{mixing}-w{w}", f"{label}, w{w}", cmd, env, want, error))
    return runs


def _rate(result: Mapping[str, Any]) -> float:
    """A run's rows/s after its first batch (0: it failed)."""
    seconds = result.get("seconds", 0.0) - result.get("first_batch_s", 0.0)
    return (result["rows"] - result["first_rows"]) / seconds if seconds > 0 else 0.0


def table_rows(
    runs: Sequence[Run],
    results: Mapping[str, Mapping[str, Any]],
    *,
    batch_size: int,
    sizes: Sequence[int],
    failed: list[str],
) -> list[list[str]]:
    """The table's rows; a mixture of ours that missed a quota is added to ``failed``."""

    def speed(kind: str) -> float | None:
        """Rows/s after the first batch (the peers' epochs are short: their set-up per epoch
        would weigh more than ours; the first batch's time has its own column)."""
        return _rate(results.get(kind, {})) or None

    out = []
    for run in runs:
        result = results[run.kind]
        if "error" in result:
            out.append([run.label, NA, NA, "not run: " + result["error"], *[NA] * 5])
            continue
        last = "/".join(f"{n:,}" for n in result["epoch_counts"][-1])
        if run.want is None:
            mad = maxdev = spread = NA
            whole = f"{last} (all rows)"
        else:
            m, d = shares(result["batch_counts"], run.want, batch_size)  # quotas ~ weights
            mad, maxdev = (NA, NA) if math.isnan(m) else (f"{m:.4f}", f"{d:.1f}")
            ok = all(list(c) == run.want for c in result["epoch_counts"])
            whole = ("yes " if ok else "no ") + last
            if not ok:
                whole += " (quotas " + "/".join(f"{n:,}" for n in run.want) + ")"
            problems = uneven(result, run.want, sizes)
            which = ", ".join(p.split(":")[0].removeprefix("source ") for p in problems)
            spread = f"no ({which})" if problems else "yes"
            if run.kind.startswith(("random", "stratified")) and (problems or not ok):
                quota = [] if ok else [f"epochs {result['epoch_counts']}, quotas {run.want}"]
                failed.append(f"{run.label}, batch {batch_size}: {'; '.join(quota + problems)}")
                whole += " (FAILED)"
        mine = speed(run.kind)
        one = speed(f"one-w{run.workers}") if run.workers is not None else None
        out.append(
            [
                run.label,
                mad,
                maxdev,
                whole,
                spread,
                f"{mine:,.0f}" if mine else NA,
                f"{result['first_batch_s']:.2f}",
                ratio(mine, speed("raw")),
                ratio(mine, one) if run.kind != "raw" else NA,
            ]
        )
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", default="400000,150000,50000", help="rows of each source")
    parser.add_argument("--weights", default="5,3,2")
    parser.add_argument("--epoch-rows", type=int, default=300_000)
    parser.add_argument("--scale", type=float, default=1.0, help="multiplies --rows, --epoch-rows")
    parser.add_argument("--batch-sizes", default="32,1024")
    parser.add_argument("--workers", default="0,2", help="num_workers of ours and the peers")
    parser.add_argument("--epochs", type=int, default=2, help="epochs a run; the last is timed")
    parser.add_argument(
        "--rounds", type=int, default=3, help="rounds of our runs, interleaved; the best kept"
    )
    parser.add_argument("--hf-epoch-rows", type=int, help="default: a tenth of --epoch-rows")
    parser.add_argument("--streaming-epoch-rows", type=int, help="default: a 50th of --epoch-rows")
    parser.add_argument("--no-peers", action="store_true", help="skip HF datasets and Streaming")
    parser.add_argument("--no-setup", action="store_true", help="do not make the peers' venvs")
    parser.add_argument("--one", help=argparse.SUPPRESS)
    parser.add_argument("--spec", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        print(json.dumps(run_ours(args.one, json.loads(args.spec))))
        return

    sizes = [max(1, round(int(n) * args.scale)) for n in args.rows.split(",")]
    weights = [float(w) for w in args.weights.split(",")]
    if len(weights) != len(sizes):
        parser.error("--weights needs one weight per source of --rows")
    epoch_rows = max(1, round(args.epoch_rows * args.scale))
    want = quotas(epoch_rows, weights)
    bounds = np.concatenate([[0], np.cumsum(sizes)]).tolist()

    import torch

    print(
        f"Python {sys.version.split()[0]}, pyarrow {pa.__version__}, numpy {np.__version__}, "
        f"torch {torch.__version__}, {os.cpu_count()} CPUs"
    )
    start = time.perf_counter()
    dirs, every = make_sources(DATA, sizes)
    made = time.perf_counter() - start
    print(
        f"sources: {', '.join(f'{n:,} rows' for n in sizes)} (ids {bounds}); weights "
        f"{args.weights}; epoch_rows {epoch_rows:,} -> quotas {'/'.join(f'{q:,}' for q in want)}; "
        f"shuffle on; {args.epochs} epochs a run, the last timed; data ready in {made:.1f} s"
    )
    print(
        f"decoded bytes per row: mixture {mean_row_bytes(dirs, want):.0f}, all rows (one source, "
        f"raw) {mean_row_bytes(dirs, sizes):.0f}"
    )
    peers: dict[str, tuple[str, int, str]] = {}
    for package, peer, _ in [] if args.no_peers else PEER_RUNS:
        rows = getattr(args, f"{peer}_epoch_rows") or epoch_rows // PEER_EPOCH_DIVISOR[peer]
        python, said = peer_python(package, peer, setup=not args.no_setup)
        peers[peer] = (python or "", rows, "" if python else said)
        print(
            f"{peer}: {said}; epochs of {rows:,} rows ({'/'.join(map(str, quotas(rows, weights)))})"
        )
    print()

    spec_base = {
        "dirs": [str(d) for d in dirs],
        "all": str(every),
        "weights": weights,
        "epoch_rows": epoch_rows,
        "epochs": args.epochs,
        "bounds": bounds,
    }
    notes: dict[str, None] = {}
    failed: list[str] = []
    for batch_size in [int(b) for b in args.batch_sizes.split(",")]:
        runs = plan_runs(args, {**spec_base, "batch_size": batch_size}, peers)
        results: dict[str, dict[str, Any]] = {}
        for round_ in range(args.rounds):  # (interleaved: the machine's drift hits all alike)
            for run in runs:
                ours = run.kind.startswith(("random", "stratified", "one", "raw"))
                if round_ and not ours:  # (the peers once: their set-up is long)
                    continue
                got = {"error": run.error} if run.error else subprocess_json(run.cmd, env=run.env)
                if "prepare_s" in got:  # a peer's one-off conversion
                    notes[f"{run.kind.split('-')[0]}: {got['prepare_s']}"] = None
                if run.kind not in results or _rate(got) > _rate(results[run.kind]):
                    results[run.kind] = got
        print(f"## batch_size {batch_size}\n")
        table(
            [
                "config",
                "MAD of shares",
                "max dev (rows)",
                "epoch exact (last epoch's rows per source)",
                "once before twice",
                "rows/s",
                "1st batch s",
                "x raw pyarrow",
                "x one source",
            ],
            table_rows(runs, results, batch_size=batch_size, sizes=sizes, failed=failed),
        )
    for note in notes:
        print(note)
    if failed:
        raise SystemExit("quota check failed:\n" + "\n".join(failed))


if __name__ == "__main__":
    main()
