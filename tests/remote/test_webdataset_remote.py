"""WebDataset shards on S3 (SeaweedFS): 2 workers, both storage backends, every sample once."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import webdataset as wds

import torch_dataloader_utils as tdu
from tests.services.seaweedfs import SeaweedFS
from torch_dataloader_utils.errors import CorruptFileError
from torch_dataloader_utils.webdataset.format import WebDatasetFormat
from torch_dataloader_utils.webdataset.writer import ShardWriter

pytestmark = [
    pytest.mark.remote,
    pytest.mark.timeout(180),
    pytest.mark.filterwarnings("ignore:This DataLoader will create:UserWarning"),
]

BUCKET = "tdu-wds"
SAMPLES = 300


def payload(i: int) -> bytes:
    return bytes([i % 256]) * (i * 53 % 5000)


@pytest.fixture(scope="module")
def s3_shards(seaweedfs: SeaweedFS, tmp_path_factory: pytest.TempPathFactory) -> str:
    """Shards with .idx (our writer) under ``indexed/``, without under ``plain/``."""
    local = tmp_path_factory.mktemp("wds-remote")
    with ShardWriter(str(local / "indexed" / "train-%03d.tar"), maxcount=70) as sink:
        for i in range(SAMPLES):
            sink.write({"__key__": f"k{i:05d}", "cls": i % 9, "bin": payload(i)})
    (local / "plain").mkdir()
    with wds.TarWriter(str(local / "plain" / "train-000.tar")) as writer:
        for i in range(SAMPLES):
            writer.write({"__key__": f"k{i:05d}", "cls": i % 9, "bin": payload(i)})
    seaweedfs.create_bucket(BUCKET)
    fs = seaweedfs.filesystem()
    for path in sorted(local.rglob("*")):
        if path.is_file():
            fs.put_file(str(path), f"{BUCKET}/{path.relative_to(local).as_posix()}")
    fs.invalidate_cache()
    return f"s3://{BUCKET}"


def read(loader: Any) -> list[str]:
    keys = []
    for batch in loader:
        for key, cls, data in zip(batch["__key__"], batch["cls"], batch["bin"], strict=True):
            i = int(key[1:])
            assert int(cls) == i % 9 and data == payload(i), key
            keys.append(key)
    return keys


@pytest.mark.parametrize("backend", ["arrow", "fsspec"])
@pytest.mark.parametrize("folder", ["indexed", "plain"])
def test_two_workers_every_sample_once(
    seaweedfs: SeaweedFS, s3_shards: str, tmp_path: Path, backend: str, folder: str
) -> None:
    loader = tdu.create_dataloader(
        f"{s3_shards}/{folder}",
        format="webdataset",
        storage_options=seaweedfs.s3fs_options(),
        storage_backend=backend,
        batch_size=32,
        shuffle=True,
        split_rows=40,
        num_workers=2,
        multiprocessing_context="fork",
        timeout=120,
        format_options={"index_cache_dir": str(tmp_path / "cache")},
    )
    if folder == "indexed":
        assert {Path(c.path).suffix for c in loader.dataset.plan.chunks} == {".tar"}
    keys = read(loader)
    assert Counter(keys) == Counter(f"k{i:05d}" for i in range(SAMPLES))


def test_a_truncated_remote_shard_names_it(seaweedfs: SeaweedFS, s3_shards: str) -> None:
    fs = seaweedfs.filesystem()
    data = fs.cat_file(f"{BUCKET}/plain/train-000.tar")
    fs.pipe_file(f"{BUCKET}/broken/train-000.tar", data[: len(data) // 2 + 100])
    with pytest.raises(CorruptFileError, match=rf"s3://{BUCKET}/broken/train-000.tar: offset \d+"):
        tdu.create_dataloader(
            f"{s3_shards}/broken",
            format="webdataset",
            storage_options=seaweedfs.s3fs_options(),
            format_options={"index_cache_dir": ""},
        )


def test_reads_started_ahead_are_used(seaweedfs: SeaweedFS, s3_shards: str, tmp_path: Path) -> None:
    # Small range requests (READ_BYTES patched in this process), so a chunk takes several:
    # prefetch starts the first, and each read starts the next while one is sliced.
    from torch_dataloader_utils.webdataset import slicing

    loader = tdu.create_dataloader(
        f"{s3_shards}/indexed",
        format="webdataset",
        storage_options=seaweedfs.s3fs_options(),
        batch_size=32,
        split_rows=40,
        format_options={"index_cache_dir": str(tmp_path / "cache")},
    )
    dataset = loader.dataset
    fmt, fs, options = dataset.format, dataset.fs, dataset.read_options
    assert isinstance(fmt, WebDatasetFormat) and not fs.is_local
    old, slicing.READ_BYTES = slicing.READ_BYTES, 20_000
    try:
        keys: list[str] = []
        for chunk in dataset.plan.chunks:
            fmt.prefetch(chunk, 0, chunk.num_rows, fs, options)
            pending = set(fmt._ahead)
            assert len(pending) == 1 and next(iter(pending))[0] == chunk.path
            batches = fmt.read(chunk, 0, chunk.num_rows, fs, options)
            first = next(batches)
            assert not pending & set(fmt._ahead)  # the prefetched bytes were taken
            for batch in [first, *batches]:
                keys += batch.column("__key__").to_pylist()
                i = [int(k[1:]) for k in batch.column("__key__").to_pylist()]
                assert batch.column("bin").to_pylist() == [payload(j) for j in i]
        assert not fmt._ahead
        fmt.close()
    finally:
        slicing.READ_BYTES = old
    assert Counter(keys) == Counter(f"k{i:05d}" for i in range(SAMPLES))


@pytest.mark.parametrize("context", ["fork", "spawn"])
def test_two_workers_with_reads_ahead(
    seaweedfs: SeaweedFS, s3_shards: str, tmp_path: Path, context: str
) -> None:
    # The main process prefetched (and so built its thread pool) before the workers start: a
    # forked worker must drop the parent's pool, not wait on it.
    fmt = WebDatasetFormat(index_cache_dir=str(tmp_path / "cache"))
    loader = tdu.create_dataloader(
        f"{s3_shards}/plain",
        format=fmt,
        storage_options=seaweedfs.s3fs_options(),
        batch_size=16,
        shuffle=True,
        split_rows=25,
        num_workers=2,
        multiprocessing_context=context,
        timeout=60,
    )
    dataset = loader.dataset
    chunk = dataset.plan.chunks[0]
    dataset.format.prefetch(chunk, 0, chunk.num_rows, dataset.fs, dataset.read_options)
    (started,) = dataset.format._ahead.values()
    started.result()  # (a fork during a request would copy the storage client's locks held)
    for _ in range(2):
        assert Counter(read(loader)) == Counter(f"k{i:05d}" for i in range(SAMPLES))
    dataset.format.close()
