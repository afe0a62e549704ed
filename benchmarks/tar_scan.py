"""Tar scanning speed: our header parser (`scan_tar`) against Python's `tarfile`, same shards,
same run.

Modes, each over every shard (page cache warm after the first pass):

- ``tarfile stream``: ``tarfile.open(mode="r|")``, every member's bytes read (how webdataset
  reads a shard);
- ``tarfile index``: ``tarfile.open(mode="r:")`` iterating members without reading data;
- ``scan_tar index``: `scan_tar` through ``os.pread``, 8 MB at a time (headers only; small
  members' data comes along in those reads);
- ``scan_tar full``: one read of the whole shard, `scan_tar` over it, every member's bytes
  sliced out (what a reader does with a chunk's range).
- ``build_index``: `scan_tar` + `group_samples` (the plan-time work per shard).

Usage::

    python benchmarks/tar_scan.py                 # 200 MB of ~4 KB members
    python benchmarks/tar_scan.py --size-mb 1000 --member-kb 100
"""

from __future__ import annotations

import argparse
import io
import os
import tarfile
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from torch_dataloader_utils.webdataset import build_index, scan_tar


def make_shards(root: Path, size_mb: int, member_kb: float, shards: int) -> list[Path]:
    """Shards of samples with two components each (``.bin`` ~member_kb KB and ``.cls``)."""
    body = os.urandom(int(member_kb * 1024))
    per_shard = size_mb * (1 << 20) // shards
    paths = []
    for s in range(shards):
        path = root / f"shard-{s:03d}.tar"
        with tarfile.open(path, "w", format=tarfile.PAX_FORMAT) as tf:
            i = 0
            while tf.offset < per_shard:
                for ext, data in (("bin", body), ("cls", str(i % 10).encode())):
                    info = tarfile.TarInfo(f"sample-{s:03d}-{i:08d}.{ext}")
                    info.size = len(data)
                    tf.addfile(info, io.BytesIO(data))
                i += 1
        paths.append(path)
    return paths


def tarfile_stream(path: Path) -> int:
    total = 0
    with open(path, "rb") as f, tarfile.open(fileobj=f, mode="r|") as tf:
        for member in tf:
            if member.isreg():
                extracted = tf.extractfile(member)
                assert extracted is not None
                total += len(extracted.read())
    return total


def tarfile_index(path: Path) -> int:
    with tarfile.open(path, mode="r:") as tf:
        return sum(m.size for m in tf)


def scan_index(path: Path) -> int:
    size = path.stat().st_size
    fd = os.open(path, os.O_RDONLY)
    try:
        members = scan_tar(lambda o, n: os.pread(fd, n, o), size, where=str(path))
        return sum(m.size for m in members)
    finally:
        os.close(fd)


def scan_full(path: Path) -> int:
    data = path.read_bytes()
    view = memoryview(data)
    total = 0
    for m in scan_tar(
        lambda o, n: view[o : o + n], len(view), where=str(path), read_bytes=len(view)
    ):
        total += len(bytes(view[m.offset : m.end]))
    return total


def index(path: Path) -> int:
    size = path.stat().st_size
    fd = os.open(path, os.O_RDONLY)
    try:
        built = build_index(lambda o, n: os.pread(fd, n, o), size, where=str(path))
        return sum(c.size for s in built.samples for c in s.components)
    finally:
        os.close(fd)


def timed(fn: Callable[[Path], int], paths: list[Path], repeat: int) -> tuple[float, int]:
    best = float("inf")
    total = 0
    for _ in range(repeat):
        start = time.perf_counter()
        total = sum(fn(p) for p in paths)
        best = min(best, time.perf_counter() - start)
    return best, total


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size-mb", type=int, default=200)
    parser.add_argument("--member-kb", type=float, default=4.0)
    parser.add_argument("--shards", type=int, default=4)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        paths = make_shards(Path(tmp), args.size_mb, args.member_kb, args.shards)
        nbytes = sum(p.stat().st_size for p in paths)
        members = sum(1 for p in paths for _ in scan_index_members(p))
        print(
            f"{len(paths)} shards, {nbytes / 1e6:.0f} MB, {members:,} members "
            f"(~{args.member_kb:g} KB + a 1-byte .cls per sample); best of {args.repeat}"
        )
        modes: dict[str, Callable[[Path], int]] = {
            "tarfile stream": tarfile_stream,
            "tarfile index": tarfile_index,
            "scan_tar index": scan_index,
            "scan_tar full": scan_full,
            "build_index": index,
        }
        results = {}
        for name, fn in modes.items():
            fn(paths[0])  # warm the page cache and imports
            seconds, total = timed(fn, paths, args.repeat)
            results[name] = seconds
            print(
                f"  {name:15s} {nbytes / seconds / 1e6:8.0f} MB/s  "
                f"{members / seconds / 1e6:6.2f} M members/s  (data bytes seen {total:,})"
            )
        base = results["tarfile stream"]
        base_index = results["tarfile index"]
        print(
            f"scan_tar full / tarfile stream: {base / results['scan_tar full']:.1f}x; "
            f"scan_tar index / tarfile index: {base_index / results['scan_tar index']:.1f}x; "
            f"scan_tar index / tarfile stream: {base / results['scan_tar index']:.1f}x"
        )


def scan_index_members(path: Path) -> list[int]:
    size = path.stat().st_size
    fd = os.open(path, os.O_RDONLY)
    try:
        return [m.size for m in scan_tar(lambda o, n: os.pread(fd, n, o), size, where=str(path))]
    finally:
        os.close(fd)


if __name__ == "__main__":
    main()
