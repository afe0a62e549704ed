"""CSV / JSON Lines throughput against raw pyarrow, and the plan-time scan cost, in one run.

The reference: ``pyarrow.csv.read_csv`` (threads on, the fastest pyarrow reads a file) and
``pyarrow.csv.open_csv`` (streaming, one thread), and ``pyarrow.json.read_json``, over the same
files. Ours: ``create_dataloader`` with shuffle on, ``num_workers`` 0 and 2, arrow output (no
conversion, so the ratio is about reading). The scan: ``CsvFormat.plan`` / ``JsonFormat.plan``
(one pass over every byte: quote parity for CSV), as MB/s of file bytes.

Usage::

    python benchmarks/formats_text.py               # 1M rows
    python benchmarks/formats_text.py --rows 200000
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.json as pajson

import torch_dataloader_utils as tdu
from torch_dataloader_utils.formats import Listing, ReadOptions
from torch_dataloader_utils.formats.text import CsvFormat, JsonFormat
from torch_dataloader_utils.fs import FileSystemSpec, list_files

HERE = Path(__file__).resolve().parent
DATA = HERE / ".data"


def make(root: Path, rows: int, files: int = 4) -> tuple[Path, Path]:
    """The same rows as CSV (10% of text values quoted, with commas) and JSON Lines."""
    csv_dir, json_dir = root / f"csv-{rows}", root / f"jsonl-{rows}"
    if (csv_dir / "_done").exists() and (json_dir / "_done").exists():
        return csv_dir, json_dir
    csv_dir.mkdir(parents=True, exist_ok=True)
    json_dir.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    per = rows // files
    for f in range(files):
        ids = np.arange(f * per, (f + 1) * per)
        cols = {"id": ids, "label": ids % 10}
        for j in range(6):
            cols[f"f{j}"] = rng.random(per).round(6)
        cols["s"] = [f"name, {i}" if i % 10 == 0 else f"n{i}" for i in ids]
        table = pa.table(cols)
        pacsv.write_csv(table, csv_dir / f"part-{f}.csv")
        with open(json_dir / f"part-{f}.jsonl", "w") as out:
            for row in table.to_pylist():
                out.write(json.dumps(row) + "\n")
    (csv_dir / "_done").touch()
    (json_dir / "_done").touch()
    return csv_dir, json_dir


def timed(fn: Callable[[], int]) -> tuple[float, int]:
    began = time.perf_counter()
    rows = fn()
    return time.perf_counter() - began, rows


def ours(root: Path, fmt: str, workers: int) -> int:
    dl = tdu.create_dataloader(
        root,
        format=fmt,
        batch_size=4096,
        shuffle=True,
        num_workers=workers,
        output_format="arrow",
        persistent_workers=workers > 0,
        **({"multiprocessing_context": "fork"} if workers else {}),
    )
    for _ in dl:  # a warm-up epoch: worker start and page cache
        pass
    return sum(b.num_rows for b in dl)


def references(name: str, paths: list[str]) -> dict[str, Callable[[], int]]:
    """Raw pyarrow reads of ``paths``: rows read."""
    if name == "jsonl":
        return {"pyarrow read_json": lambda: sum(pajson.read_json(p).num_rows for p in paths)}
    single = pacsv.ReadOptions(use_threads=False)
    return {
        "pyarrow read_csv": lambda: sum(pacsv.read_csv(p).num_rows for p in paths),
        "pyarrow open_csv": lambda: sum(
            b.num_rows for p in paths for b in pacsv.open_csv(p, read_options=single)
        ),
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=1_000_000)
    args = parser.parse_args()
    csv_dir, json_dir = make(DATA, args.rows)
    fs = FileSystemSpec("file")
    for name, root, fmt in (("csv", csv_dir, CsvFormat()), ("jsonl", json_dir, JsonFormat())):
        files = [f for f in list_files(str(root), fs) if not f.path.endswith("_done")]
        size = sum(f.size for f in files)
        paths = [f.path for f in files]
        scans = []
        for _ in range(2):
            began = time.perf_counter()
            fmt.plan(Listing.of(files), fs, ReadOptions())
            scans.append(time.perf_counter() - began)
        print(
            f"{name}: {size / 1e6:.0f} MB; plan-time scan {size / scans[0] / 1e6:.0f} MB/s "
            f"first, {size / scans[1] / 1e6:.0f} MB/s again"
        )
        refs = references(name, paths)
        limit = 0.0
        for label, fn in refs.items():
            dt, rows = timed(fn)
            limit = max(limit, rows / dt)
            print(f"  {label:18s} {rows / dt / 1e6:6.2f} M rows/s")
        for workers in (0, 2):
            dt, rows = timed(lambda r=root, n=name, w=workers: ours(r, n, w))  # type: ignore[misc]
            # Two epochs were read; the rate counts both, planning included.
            rate = 2 * rows / dt
            print(f"  ours, {workers} workers    {rate / 1e6:6.2f} M rows/s  ({rate / limit:.2f}x)")


if __name__ == "__main__":
    main()
