"""WebDataset tar shards: samples/s of ours against webdataset 1.0.2, same shards, same run.

The shards: ``--shards`` x ``--samples`` small samples, each a 4,000-byte ``bin`` payload, a
``cls`` label and a small ``json`` record (~4 KB of data, ~6.5 KB of tar with headers and
padding), written by webdataset's ``TarWriter`` (no ``.idx``: ours builds and caches the
indexes on the first plan, which is excluded from the timings).

Both sides decode the same: ``cls`` to an int, ``json`` to Python objects, ``bin`` kept as
bytes; batches of 256, no shuffling, ``num_workers`` 0 and 2 (persistent workers, so the
timed epochs exclude worker start-up).

- ours: ``create_dataloader(format="webdataset", columns=["bin", "cls", "json"],
  batch_size=256, shuffle=False)``;
- webdataset: ``wds.WebDataset(urls, shardshuffle=False).decode().to_tuple("bin", "cls",
  "json").batched(256)`` in ``torch.utils.data.DataLoader(batch_size=None)``.

Configurations are interleaved, ``--repeat`` epochs each; the best epoch of each is kept (the
machine is shared and noisy). Prints samples/s, MB/s of tar and the ratios.

Usage::

    python benchmarks/webdataset.py
    python benchmarks/webdataset.py --shards 4 --samples 2000 --repeat 3
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
# This script's own name would shadow the webdataset package: leave its folder off the path.
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != HERE]

import numpy as np  # noqa: E402
import torch  # noqa: E402
import webdataset as wds  # noqa: E402

import torch_dataloader_utils as tdu  # noqa: E402

DATA = HERE / ".data"
PAYLOAD = 4000
BATCH = 256


def make_shards(root: Path, shards: int, samples: int) -> list[str]:
    """Write the shards once (kept under ``benchmarks/.data``)."""
    out = root / f"wds-{shards}x{samples}"
    urls = [str(out / f"train-{s:06d}.tar") for s in range(shards)]
    if (out / "_done").exists():
        return urls
    out.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    for s, url in enumerate(urls):
        with wds.TarWriter(url) as writer:
            for i in range(s * samples, (s + 1) * samples):
                writer.write(
                    {
                        "__key__": f"{i:09d}",
                        "bin": rng.bytes(PAYLOAD),
                        "cls": i % 1000,
                        "json": json.dumps({"id": i, "label": i % 1000}).encode(),
                    }
                )
    (out / "_done").touch()
    return urls


def ours(urls: list[str], num_workers: int, cache: Path) -> Iterable[Any]:
    extra: dict[str, Any] = {}
    if num_workers:
        extra = {"persistent_workers": True, "multiprocessing_context": "fork"}
    return tdu.create_dataloader(
        urls,
        format="webdataset",
        columns=["bin", "cls", "json"],
        batch_size=BATCH,
        shuffle=False,
        num_workers=num_workers,
        format_options={"index_cache_dir": str(cache)},
        **extra,
    )


def theirs(urls: list[str], num_workers: int) -> Iterable[Any]:
    dataset = (
        wds.WebDataset(urls, shardshuffle=False, empty_check=False)
        .decode()
        .to_tuple("bin", "cls", "json")
        .batched(BATCH)
    )
    extra: dict[str, Any] = {}
    if num_workers:
        extra = {"persistent_workers": True, "multiprocessing_context": "fork"}
    return torch.utils.data.DataLoader(dataset, batch_size=None, num_workers=num_workers, **extra)


def count_ours(batch: dict[str, Any]) -> int:
    assert isinstance(batch["bin"][0], bytes) and isinstance(batch["json"][0], dict)
    return len(batch["cls"])


def count_theirs(batch: tuple[Any, ...]) -> int:
    assert isinstance(batch[0][0], bytes) and isinstance(batch[2][0], dict)
    return len(batch[1])


def epoch(loader: Iterable[Any], count: Callable[[Any], int]) -> tuple[int, float]:
    started = time.perf_counter()
    n = sum(count(batch) for batch in loader)
    return n, time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shards", type=int, default=8)
    parser.add_argument("--samples", type=int, default=5000, help="samples per shard")
    parser.add_argument("--repeat", type=int, default=3, help="timed epochs per configuration")
    parser.add_argument("--workers", type=int, nargs="+", default=[0, 2])
    parser.add_argument("--data", type=Path, default=DATA)
    args = parser.parse_args()

    urls = make_shards(args.data, args.shards, args.samples)
    total = args.shards * args.samples
    tar_mb = sum(os.path.getsize(u) for u in urls) / 1e6
    print(
        f"{args.shards} shards x {args.samples} samples ({total} samples, {tar_mb:.0f} MB of tar): "
        f"bin {PAYLOAD} B + cls + json per sample; batches of {BATCH}; best of {args.repeat}"
    )
    cache = args.data / "wds-index-cache"
    loaders: dict[str, tuple[Iterable[Any], Callable[[Any], int]]] = {}
    for w in args.workers:
        loaders[f"ours, {w} workers"] = (ours(urls, w, cache), count_ours)
        loaders[f"webdataset, {w} workers"] = (theirs(urls, w), count_theirs)
    best: dict[str, float] = {}
    for name, (loader, count) in loaders.items():  # warm-up epoch: workers, page cache
        n, _ = epoch(loader, count)
        if n != total:
            raise SystemExit(f"{name}: {n} samples in an epoch, expected {total}")
    for _ in range(args.repeat):
        for name, (loader, count) in loaders.items():  # interleaved
            n, seconds = epoch(loader, count)
            best[name] = max(best.get(name, 0.0), n / seconds)
    for name, rate in best.items():
        print(f"{name:24s} {rate:>10,.0f} samples/s  {rate / total * tar_mb:>7.0f} MB/s")
    for w in args.workers:
        ratio = best[f"ours, {w} workers"] / best[f"webdataset, {w} workers"]
        print(f"ratio ours/webdataset, {w} workers: {ratio:.1f}x")


if __name__ == "__main__":
    main()
