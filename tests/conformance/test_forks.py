"""`check_fork` on every built-in format, on local files and on fsspec's memory filesystem
(where Parquet fetches row groups, and WebDataset reads ranges, in threads of their own), and
proof that it fails a format that is not fork-safe."""

from __future__ import annotations

import io
import json
import tarfile
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import fsspec
import numpy as np
import pyarrow as pa
import pyarrow.csv as pacsv
import pytest

from tests.conftest import write_parquet
from tests.format_files import write_ipc, write_orc
from torch_dataloader_utils import get_format
from torch_dataloader_utils.formats import Format, FormatPlan, Listing, ReadOptions
from torch_dataloader_utils.formats.parquet import ParquetFormat
from torch_dataloader_utils.fs import FileSystemSpec, list_files
from torch_dataloader_utils.planning import Chunk
from torch_dataloader_utils.testing import check_fork

# Two files of each format: rows 0-299 and 300-499, in native units of 100 rows.
FILES = ((0, 300), (300, 500))


def _write_text(path: Path, ids: np.ndarray, kind: str) -> None:
    if kind == "csv":
        pacsv.write_csv(pa.table({"id": ids, "name": [f"row-{i}" for i in ids]}), path)
    else:
        path.write_text("".join(json.dumps({"id": int(i), "name": f"row-{i}"}) + "\n" for i in ids))


def _write_shard(path: Path, ids: np.ndarray) -> None:
    with tarfile.open(path, "w") as tar:
        for i in ids:
            for ext, data in (("id", str(i).encode()), ("bin", bytes([i % 251]) * (i % 7 * 300))):
                member = tarfile.TarInfo(f"s{i:05d}.{ext}")
                member.size = len(data)
                tar.addfile(member, io.BytesIO(data))


def write_source(root: Path, name: str) -> None:
    """Two files of format ``name`` under ``root`` (see `FILES`)."""
    root.mkdir(parents=True)
    for k, (lo, hi) in enumerate(FILES):
        ids = np.arange(lo, hi)
        if name == "parquet":
            write_parquet(root / f"p{k}.parquet", ids, row_group_size=100)
        elif name == "orc":
            write_orc(root / f"p{k}.orc", ids, stripe_rows=100)
        elif name == "ipc":
            write_ipc(root / f"p{k}.arrow", ids, batch_rows=100)
        elif name in ("csv", "json"):
            _write_text(root / f"p{k}.{name}", ids, name)
        else:
            _write_shard(root / f"p{k}.tar", ids)


@pytest.fixture
def memory_root() -> Iterator[str]:
    root = f"/tdu-forks-{uuid.uuid4().hex}"
    yield root
    memory = fsspec.filesystem("memory")
    if memory.exists(root):
        memory.rm(root, recursive=True)


def _source(tmp_path: Path, name: str, where: str, memory_root: str) -> str:
    root = tmp_path / name
    write_source(root, name)
    if where == "local":
        return str(root)
    memory = fsspec.filesystem("memory")
    for path in sorted(root.iterdir()):
        memory.pipe(f"{memory_root}/{path.name}", path.read_bytes())
    return f"memory://{memory_root}"


def _plan(fmt: Format, source: str, options: ReadOptions) -> tuple[FormatPlan, FileSystemSpec]:
    fs = FileSystemSpec.for_path(source)
    files = list_files(source, fs)
    return fmt.plan(Listing.of(files), fs, options), fs


# Options that make a chunk several native units, so a read is mid-chunk at the fork.
OPTIONS: dict[str, dict[str, Any]] = {
    "csv": {"chunk_bytes": 1024},
    "json": {"chunk_bytes": 1024},
    "webdataset": {"index_cache_dir": ""},
}


@pytest.mark.parametrize("where", ["local", "memory"])
@pytest.mark.parametrize("name", ["parquet", "orc", "ipc", "csv", "json", "webdataset"])
def test_built_in_formats_read_the_same_in_a_forked_child(
    tmp_path: Path, memory_root: str, name: str, where: str
) -> None:
    fmt = get_format(name, OPTIONS.get(name))
    options = ReadOptions(split_rows=250)
    plan, fs = _plan(fmt, _source(tmp_path, name, where, memory_root), options)
    chunk = max(plan.chunks, key=lambda c: c.num_rows)
    try:
        reading = plan.read_options or options  # what the plan learned travels in them
        check_fork(fmt, chunk, fs=fs, options=reading, schema=plan.schema, timeout=30)
    finally:
        fmt.close()


class DecodesOnItsFirstThreads(ParquetFormat):
    """Not fork-safe: reads on a thread pool made in the first process that reads. A forked
    child submits to threads that exist only in its parent, and waits for ever."""

    def __init__(self, **options: Any) -> None:
        super().__init__(**options)
        self.pool = ThreadPoolExecutor(1)

    def read(
        self, chunk: Chunk, row_start: int, row_stop: int, fs: FileSystemSpec, options: ReadOptions
    ) -> Iterator[pa.RecordBatch]:
        parent = super().read
        yield from self.pool.submit(
            lambda: list(parent(chunk, row_start, row_stop, fs, options))
        ).result()


def test_the_fork_check_fails_a_format_that_waits_on_its_parents_threads(
    tmp_path: Path, memory_root: str
) -> None:
    fmt = DecodesOnItsFirstThreads()
    plan, fs = _plan(fmt, _source(tmp_path, "parquet", "local", memory_root), ReadOptions())
    try:
        with pytest.raises(AssertionError, match=r"did not finish in 2 s: it waits on"):
            check_fork(
                fmt, plan.chunks[0], fs=fs, options=ReadOptions(), schema=plan.schema, timeout=2
            )
    finally:
        fmt.pool.shutdown()
        fmt.close()
