"""ORC and Arrow IPC (file and stream format) read from S3 (SeaweedFS) by real DataLoader
workers, through pyarrow's native S3 filesystem and through s3fs: every row exactly once."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

import torch_dataloader_utils as tdu
from tests.format_files import write_orc_ipc_source
from tests.services.seaweedfs import SeaweedFS
from torch_dataloader_utils.errors import CorruptFileError
from torch_dataloader_utils.formats import Listing, ReadOptions
from torch_dataloader_utils.formats.ipc import IpcFormat
from torch_dataloader_utils.formats.orc import OrcFormat
from torch_dataloader_utils.fs import FileSystemSpec, list_files

pytestmark = [
    pytest.mark.remote,
    pytest.mark.timeout(120),
    pytest.mark.filterwarnings("ignore:This DataLoader will create:UserWarning"),
]

BUCKET = "tdu-orc-ipc"
# (rows, rows per stripe or record batch): one big file of many units, small ones, an empty one.
FILES = [(3000, 250), (0, 10), (400, 64), (37, 5)]
ROWS = sum(rows for rows, _ in FILES)


@pytest.fixture(scope="module")
def remote_sources(
    seaweedfs: SeaweedFS, tmp_path_factory: pytest.TempPathFactory
) -> dict[str, str]:
    """``{format: s3 url}`` of an ORC and an IPC (files and streams) source."""
    seaweedfs.create_bucket(BUCKET)
    fs = seaweedfs.filesystem()
    urls = {}
    for fmt in ("orc", "ipc"):
        local = write_orc_ipc_source(tmp_path_factory.mktemp(fmt), fmt, FILES)
        for path in sorted(local.iterdir()):
            fs.put_file(str(path), f"{BUCKET}/{fmt}/{path.name}")
        urls[fmt] = f"s3://{BUCKET}/{fmt}"
    fs.invalidate_cache()
    return urls


@pytest.mark.parametrize("backend", ["arrow", "fsspec"])
@pytest.mark.parametrize("fmt", ["orc", "ipc"])
def test_two_workers_read_every_row_once(
    seaweedfs: SeaweedFS, remote_sources: dict[str, str], fmt: str, backend: str
) -> None:
    loader = tdu.create_dataloader(
        remote_sources[fmt],
        format=fmt,
        batch_size=128,
        shuffle=True,
        storage_options=seaweedfs.s3fs_options(),
        storage_backend=backend,
        num_workers=2,
        multiprocessing_context="fork",
        timeout=60,
    )
    seen = [i for batch in loader for i in batch["id"].tolist()]
    assert Counter(seen) == Counter(range(ROWS))
    assert seen != sorted(seen)  # shuffled


@pytest.mark.parametrize("backend", ["arrow", "fsspec"])
def test_formats_on_s3_plan_and_read_like_local(
    seaweedfs: SeaweedFS, remote_sources: dict[str, str], tmp_path: Path, backend: str
) -> None:
    for fmt, format_ in (("orc", OrcFormat()), ("ipc", IpcFormat())):
        fs = FileSystemSpec("s3", seaweedfs.s3fs_options(), backend=backend)
        files = list_files(remote_sources[fmt], fs)
        plan = format_.plan(Listing.of(files), fs, ReadOptions(columns=("id",)))
        assert [c.num_rows for c in plan.chunks][:2] == [250, 250]
        ids = [
            i
            for chunk in plan.chunks
            for batch in format_.read(chunk, 0, chunk.num_rows, fs, ReadOptions(columns=("id",)))
            for i in batch.column("id").to_pylist()
        ]
        assert ids == list(range(ROWS))
        format_.close()


def test_a_corrupt_object_names_its_url(
    seaweedfs: SeaweedFS, remote_sources: dict[str, str]
) -> None:
    fs = seaweedfs.filesystem()
    fs.pipe_file(f"{BUCKET}/bad/x.orc", b"ORC" + bytes(range(200)))
    fs.pipe_file(f"{BUCKET}/bad/x.arrow", b"ARROW1\0\0" + bytes(range(200)))
    fs.invalidate_cache()
    for name, fmt in (("x.orc", "orc"), ("x.arrow", "ipc")):
        url = f"s3://{BUCKET}/bad/{name}"
        with pytest.raises(CorruptFileError, match=url):
            tdu.create_dataloader(
                url, format=fmt, storage_options=seaweedfs.s3fs_options(), num_workers=0
            )
