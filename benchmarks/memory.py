"""Peak memory of each process against the data's size, the stated bound and raw pyarrow.

Six datasets, generated in a temporary folder (removed afterwards):

- **narrow**: ``--narrow-rows`` rows of an int64 id, 8 float32 and an int64 (~48 B a row);
- **wide**: ``--wide-rows`` rows of ``--wide-mb`` MB of random bytes, written by
  ``pq.write_table`` with its defaults: ONE row group, and pages of up to 1,024 values (the
  first 1,024 values in one dictionary page, then plain pages);
- **wide-paged**: the same rows written with ``write_batch_size=1``: one value per page;
- **wide-groups**: the same rows in row groups of 16 rows;
- **tokens**: ``--token-rows`` rows of ``list<int32>`` of 512 to 4,096 tokens, one row group;
- **images**: ``--image-samples`` WebDataset samples of ``--image-kb`` KB (``jpg`` bytes and a
  ``cls``) in tar shards written by the library's ``ShardWriter``.

Configurations, each in its own subprocess for two epochs: ``raw`` (pyarrow
``ParquetFile.iter_batches(batch_size=...)`` over each file, one process, no shuffle; for tar
shards, Python's ``tarfile`` reading every member), ``w0`` (``create_dataloader(shuffle=True)``,
``num_workers=0``; ``--no-shuffle`` for ``shuffle=False``) and ``w2`` (two persistent
workers). The consumer sleeps ``--step-ms`` per
batch, like a training step, so every buffer fills up (the worst case). For every process the
script reports peak RSS (``VmHWM``) and peak PSS (``/proc/<pid>/smaps_rollup`` sampled every
20 ms: PSS splits the pages a forked worker shares with the main process instead of counting
them in both), and ``base``: the RSS of the process after its imports, before any data was
read. ``plan`` is the main process's peak RSS once ``create_dataloader`` returned (planning
reads in the main process). ``bound`` is the documented bound on any process's peak RSS
(docs/concepts/memory.md): ``base + 5 x block + 3 x page + 192 MiB``, where ``block`` is the
shuffle block's bytes (at least one batch) and ``page`` the largest Parquet page in the data
(compressed or decompressed, the larger).

Usage::

    python benchmarks/memory.py                       # all datasets, ~2.5 minutes on 2 cores
    python benchmarks/memory.py --datasets wide --wide-rows 2000   # issue 13's 4 GB row group
    python benchmarks/memory.py --block-mb 16 --batch-size 16
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

MB = 1e6
_SAMPLE_SECONDS = 0.02


# --- data --------------------------------------------------------------------------------------


def make_narrow(root: Path, rows: int) -> Path:
    out = root / "narrow"
    out.mkdir()
    rng = np.random.default_rng(0)
    cols: dict[str, Any] = {"id": np.arange(rows)}
    for j in range(8):
        cols[f"f{j}"] = rng.random(rows, dtype=np.float32)
    cols["label"] = rng.integers(0, 1000, rows)
    pq.write_table(pa.table(cols), out / "part-000.parquet")
    return out


# How the wide datasets are written: pq.write_table's defaults (one row group, pages of up to
# 1,024 values), one value per page, or row groups of 16 rows.
_WIDE_LAYOUTS: dict[str, dict[str, int]] = {
    "wide": {},
    "wide-paged": {"write_batch_size": 1},
    "wide-groups": {"row_group_size": 16},
}


def make_wide(root: Path, rows: int, mb: float, layout: str) -> Path:
    """``rows`` distinct values of ``mb`` MB (slices of one random buffer)."""
    out = root / layout
    out.mkdir()
    size = int(mb * MB)
    blob = np.random.default_rng(1).integers(0, 256, size + rows, dtype=np.uint8).tobytes()
    values = pa.array([blob[i : i + size] for i in range(rows)], pa.binary())
    table = pa.table({"id": np.arange(rows), "blob": values})
    pq.write_table(table, out / "part-000.parquet", **_WIDE_LAYOUTS[layout])
    return out


def make_tokens(root: Path, rows: int) -> Path:
    out = root / "tokens"
    out.mkdir()
    rng = np.random.default_rng(2)
    lengths = rng.integers(512, 4097, rows)
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
    values = rng.integers(0, 50_000, int(offsets[-1]), dtype=np.int32)
    tokens = pa.ListArray.from_arrays(pa.array(offsets), pa.array(values))
    pq.write_table(pa.table({"id": np.arange(rows), "tokens": tokens}), out / "part-000.parquet")
    return out


def make_images(root: Path, samples: int, kb: int) -> Path:
    from torch_dataloader_utils import ShardWriter

    out = root / "images"
    out.mkdir()
    size = kb * 1000
    blob = np.random.default_rng(3).integers(0, 256, size + samples, dtype=np.uint8).tobytes()
    with ShardWriter(str(out / "train-%04d.tar"), maxsize=100 * 2**20, index=True) as writer:
        for i in range(samples):
            writer.write({"__key__": f"{i:08d}", "jpg": blob[i : i + size], "cls": i % 1000})
    return out


def largest_page(data: Path) -> int:
    """Bytes of the largest page (compressed or decompressed, the larger) of any file."""
    # The page headers' Thrift is walked with the footer reader's compact-protocol parser:
    # a PageHeader's fields 2 and 3 are its uncompressed and compressed sizes.
    from torch_dataloader_utils.formats.parquet.thrift import integer_field

    largest = 0
    for path in sorted(data.glob("*.parquet")):
        md = pq.read_metadata(path)
        with open(path, "rb") as f:
            for rg in range(md.num_row_groups):
                for j in range(md.num_columns):
                    column = md.row_group(rg).column(j)
                    pos = column.dictionary_page_offset or column.data_page_offset
                    end = pos + column.total_compressed_size
                    while pos < end:
                        f.seek(pos)
                        head = f.read(1024)
                        uncompressed, _ = integer_field(head, 0, 2, 0)
                        compressed, length = integer_field(head, 0, 3, 0)
                        assert uncompressed is not None and compressed is not None, path
                        largest = max(largest, uncompressed, compressed)
                        pos += length + compressed
    return largest


# --- measuring -----------------------------------------------------------------------------------


def _status_kb(pid: int | str, key: str) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1])
    return 0


def _pss_kb(pid: int | str) -> int:
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            for line in f:
                if line.startswith("Pss:"):
                    return int(line.split()[1])
    except OSError:  # the process exited
        pass
    return 0


def _children(pid: int) -> list[int]:
    found: list[int] = []
    for task in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{task}/children") as f:
                found += [int(c) for c in f.read().split()]
        except OSError:
            continue
    return found


class Sampler:
    """Samples the PSS of this process and of its children every 20 ms, in a thread."""

    def __init__(self) -> None:
        self.pss: dict[int, int] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        me = os.getpid()
        while not self._stop.is_set():
            for pid in [me, *_children(me)]:
                self.pss[pid] = max(self.pss.get(pid, 0), _pss_kb(pid))
            time.sleep(_SAMPLE_SECONDS)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()


def run_one(kind: str, dataset: str, data: Path, args: argparse.Namespace) -> dict[str, Any]:
    import torch  # noqa: F401  (imported before measuring, as a training script would)

    import torch_dataloader_utils as tdu

    base = _status_kb("self", "VmRSS") / 1e3
    sampler = Sampler()
    rows = 0
    plan_rss = float("nan")
    workers_rss: list[float] = []
    if kind == "raw" and dataset == "images":
        for _epoch in range(2):
            for path in sorted(data.glob("*.tar")):
                with tarfile.open(path) as tar:
                    for member in tar:
                        f = tar.extractfile(member)
                        if f is not None and member.name.endswith(".jpg"):
                            f.read()
                            rows += 1
    elif kind == "raw":
        for _epoch in range(2):
            for path in sorted(data.glob("*.parquet")):
                reader = pq.ParquetFile(path)
                for batch in reader.iter_batches(batch_size=args.batch_size):
                    rows += batch.num_rows
                    time.sleep(args.step_ms / 1e3)
    else:
        workers = int(kind.removeprefix("w"))
        loader, dataset_ = tdu.StructuredDataset.create_dataloader(
            str(data),
            format="webdataset" if dataset == "images" else "parquet",
            batch_size=args.batch_size,
            shuffle=args.shuffle,
            shuffle_block_bytes=int(args.block_mb * 2**20),
            num_workers=workers,
            persistent_workers=workers > 0,
            list_format="offsets",
        )
        plan_rss = _status_kb("self", "VmHWM") / 1e3
        for epoch in range(2):
            loader.set_epoch(epoch)
            for batch in loader:
                rows += len(batch["id"] if "id" in batch else batch["cls"])
                time.sleep(args.step_ms / 1e3)  # a training step: every buffer fills up
        # Persistent workers are still alive: their high-water marks can be read.
        workers_rss = [_status_kb(pid, "VmHWM") / 1e3 for pid in _children(os.getpid())]
        del loader, dataset_
    sampler.stop()
    me = os.getpid()
    workers_pss = [kb / 1e3 for pid, kb in sampler.pss.items() if pid != me]
    return {
        "rows": rows,
        "base": base,
        "plan": plan_rss,
        "rss": _status_kb("self", "VmHWM") / 1e3,  # (ru_maxrss keeps the parent's across exec)
        "pss": sampler.pss.get(me, 0) / 1e3,
        "wrk_rss": max(workers_rss, default=float("nan")),
        "wrk_pss": max(workers_pss, default=float("nan")),
        "pool": pa.default_memory_pool().max_memory() / MB,
    }


def _subprocess(kind: str, dataset: str, data: Path, args: argparse.Namespace) -> dict[str, Any]:
    cmd = [sys.executable, __file__, "--one", kind, "--dataset", dataset, "--data", str(data)]
    cmd += ["--batch-size", str(args.batch_size), "--block-mb", str(args.block_mb)]
    cmd += ["--step-ms", str(args.step_ms), "--shuffle" if args.shuffle else "--no-shuffle"]
    done = subprocess.run(cmd, check=False, capture_output=True, text=True)
    if done.returncode:
        return {"error": done.stderr.strip().splitlines()[-1] if done.stderr else done.returncode}
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def _row_bytes(data: Path, dataset: str) -> float:
    """Bytes per row: tar members' sizes, or the footers' uncompressed sizes (decoding rows
    here would cost what is being measured)."""
    if dataset == "images":
        sizes: list[int] = []
        for path in data.glob("*.tar"):
            with tarfile.open(path) as tar:
                sizes += [m.size for m in tar if m.isfile()]
        return sum(sizes) / (len(sizes) / 2)  # two members a sample
    total = rows = 0
    for path in data.glob("*.parquet"):
        md = pq.read_metadata(path)
        rows += md.num_rows
        total += sum(md.row_group(i).total_byte_size for i in range(md.num_row_groups))
    return total / max(rows, 1)


def bound_mb(base: float, block: float, page: float) -> float:
    """The documented bound on a process's peak RSS (docs/concepts/memory.md), in MB."""
    return base + (5 * block + 3 * page + 192 * 2**20) / MB


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--datasets", default="narrow,wide,wide-paged,wide-groups,tokens,images")
    parser.add_argument("--narrow-rows", type=int, default=1_000_000)
    parser.add_argument("--wide-rows", type=int, default=300)
    parser.add_argument("--wide-mb", type=float, default=2.0)
    parser.add_argument("--token-rows", type=int, default=20_000)
    parser.add_argument("--image-samples", type=int, default=2_000)
    parser.add_argument("--image-kb", type=int, default=200)
    parser.add_argument("--batch-size", type=int, default=None, help="default: per dataset")
    parser.add_argument("--block-mb", type=float, default=64.0, help="shuffle_block_bytes, MiB")
    parser.add_argument("--configs", default="raw,w0,w2")
    parser.add_argument("--shuffle", action=argparse.BooleanOptionalAction, default=True)
    parser.add_argument(
        "--step-ms", type=float, default=10.0, help="sleep per batch: a slow consumer"
    )
    parser.add_argument("--one", help=argparse.SUPPRESS)
    parser.add_argument("--dataset", help=argparse.SUPPRESS)
    parser.add_argument("--data", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        print(json.dumps(run_one(args.one, args.dataset, Path(args.data), args)))
        return
    # Rows per batch: ~1 MB batches for the narrow ones, 8 rows of images or blobs.
    batch_sizes = {"narrow": 4096, "tokens": 64, "images": 32, **dict.fromkeys(_WIDE_LAYOUTS, 8)}
    makers = {
        "narrow": lambda root: make_narrow(root, args.narrow_rows),
        **{
            layout: functools.partial(
                make_wide, rows=args.wide_rows, mb=args.wide_mb, layout=layout
            )
            for layout in _WIDE_LAYOUTS
        },
        "tokens": lambda root: make_tokens(root, args.token_rows),
        "images": lambda root: make_images(root, args.image_samples, args.image_kb),
    }
    print(f"cpus={os.cpu_count()} shuffle_block_bytes={args.block_mb:g} MiB; MB = 10^6 bytes")
    print("peak RSS (VmHWM) and PSS (sampled) per process; wrk = the larger worker's;")
    print("bound = base + 5 x block + 3 x largest page + 192 MiB (docs/concepts/memory.md);")
    print("/bound and x raw: the largest process's peak RSS over the bound, over raw pyarrow's")
    head = f"{'dataset':10} {'data MB':>7} {'page MB':>7} {'config':6} {'base':>5} {'plan':>6} "
    head += f"{'RSS':>6} {'PSS':>6} {'wrk RSS':>7} {'wrk PSS':>7} {'bound':>6} {'/bound':>6} "
    print(head + f"{'x raw':>6}")
    root = Path(tempfile.mkdtemp(prefix="tdu-memory-"))
    try:
        for dataset in args.datasets.split(","):
            data = makers[dataset](root)
            size = sum(p.stat().st_size for p in data.iterdir()) / MB
            page = largest_page(data) if dataset != "images" else 0
            batch_size = args.batch_size or batch_sizes[dataset]
            run_args = argparse.Namespace(**{**vars(args), "batch_size": batch_size})
            # A block holds whole batches: at least one.
            block = max(args.block_mb * 2**20, batch_size * _row_bytes(data, dataset))
            raw = float("nan")
            for kind in args.configs.split(","):
                r = _subprocess(kind, dataset, data, run_args)
                line = f"{dataset:10} {size:7.0f} {page / MB:7.1f} {kind:6} "
                if "error" in r:
                    print(line + f"failed: {r['error']}", flush=True)
                    continue
                worst = max(r["rss"], r["wrk_rss"] if r["wrk_rss"] == r["wrk_rss"] else 0)
                if kind == "raw":
                    raw, bound, ratio = worst, float("nan"), float("nan")
                else:
                    bound = bound_mb(r["base"], block, page)
                    ratio = worst / bound
                print(
                    line + f"{r['base']:5.0f} {r['plan']:6.0f} {r['rss']:6.0f} {r['pss']:6.0f} "
                    f"{r['wrk_rss']:7.0f} {r['wrk_pss']:7.0f} {bound:6.0f} {ratio:6.2f} "
                    f"{worst / raw:6.2f}",
                    flush=True,
                )
            shutil.rmtree(data)
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
