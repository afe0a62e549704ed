"""Parquet footers read through pyarrow's C++ reader while planning (`facts._native_footer`):
one ranged GET a file by pyarrow's own S3 client (and its GCS client), no metadata request, the
plan the byte path makes, real-world files' facts unchanged, a bad file named as the byte path
names it, and a table's data files read at the size its metadata tells."""

from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

import torch_dataloader_utils as tdu
from tests.corpus.cases import ROOT as CORPUS
from tests.services.seaweedfs import SeaweedFS
from torch_dataloader_utils.formats.parquet import facts as parquet_facts
from torch_dataloader_utils.formats.parquet.footer import file_metadata
from torch_dataloader_utils.fs import FileSystemSpec

from .conftest import MakeProxy

pytestmark = [
    pytest.mark.remote,
    pytest.mark.timeout(180),
    pytest.mark.filterwarnings("ignore:This DataLoader will create:UserWarning"),
]

BUCKET = "tdu-native-footers"
FILES = 130  # at least `planning._NATIVE_FILES`: the share planning reads natively
ROWS = 40  # a file's rows, in row groups of 16


def _table(i: int) -> pa.Table:
    ids = np.arange(i * ROWS, (i + 1) * ROWS, dtype=np.int64)
    return pa.table({"id": ids, "x": ids * 0.5, "s": [f"row {k}" for k in ids]})


@pytest.fixture(scope="module")
def many(seaweedfs: SeaweedFS) -> str:
    """`FILES` small Parquet files under one prefix; its URL."""
    seaweedfs.create_bucket(BUCKET)
    fs = seaweedfs.filesystem()
    for i in range(FILES):
        with fs.open(f"{BUCKET}/many/part-{i:04d}.parquet", "wb") as out:
            pq.write_table(_table(i), out, row_group_size=16)
    return f"s3://{BUCKET}/many"


def _clients(proxy: Any) -> Counter[tuple[str, str]]:
    """Each request the proxy saw: (method, client), the client from its user agent."""
    return Counter(
        (method, "pyarrow" if "aws-sdk-cpp" in agent else "botocore")
        for method, agent in proxy.agents
    )


def _recording(fault_proxy: MakeProxy) -> Any:
    """A proxy that injects nothing and keeps each request's method and user agent."""
    seen: list[tuple[str, str]] = []

    def record(request: Any) -> bool:
        seen.append((request.method, request.header("user-agent") or ""))
        return False  # (never eligible for a fault)

    proxy = fault_proxy(slow_rate=1.0, delay=0.0, match=record)
    proxy.agents = seen
    return proxy


def test_many_footers_are_read_by_pyarrow_one_get_each_and_plan_alike(
    seaweedfs: SeaweedFS, many: str, fault_proxy: MakeProxy
) -> None:
    proxy = _recording(fault_proxy)
    options = seaweedfs.s3fs_options(endpoint_url=proxy.endpoint_url)
    loader = tdu.create_dataloader(many, storage_options=options, batch_size=64, num_workers=0)
    asked = _clients(proxy)
    # One footer GET a file by pyarrow's client; botocore listed and read the first schema.
    assert asked[("GET", "pyarrow")] == FILES, asked
    assert not asked[("HEAD", "pyarrow")] and asked[("HEAD", "botocore")] <= 1, asked
    through_fsspec = tdu.create_dataloader(
        many, storage_options=options, storage_backend="fsspec", batch_size=64, num_workers=0
    )
    assert loader.dataset.plan.fingerprint == through_fsspec.dataset.plan.fingerprint
    got = Counter(i for batch in loader for i in batch["id"].tolist())
    assert got == Counter(range(FILES * ROWS))


def test_a_row_filter_prunes_the_row_groups_the_byte_path_prunes(
    seaweedfs: SeaweedFS, many: str
) -> None:
    kept = pc.field("id") < 1000
    loaders = [
        tdu.create_dataloader(
            many,
            storage_options=seaweedfs.s3fs_options(),
            storage_backend=backend,
            filters=kept,
            batch_size=64,
            num_workers=0,
        )
        for backend in ("auto", "fsspec")
    ]
    plans = [loader.dataset.plan for loader in loaders]
    assert plans[0].fingerprint == plans[1].fingerprint
    # Files of 40 rows in row groups of 16, 16 and 8: the statistics keep the 25 files' 75
    # row groups of ids below 1,000 (of 390).
    assert len(plans[0].chunks) == 75, len(plans[0].chunks)
    got = Counter(i for batch in loaders[0] for i in batch["id"].tolist())
    assert got == Counter(range(1000))


def _child(request: dict[str, Any]) -> dict[str, Any]:
    """`native_footers_child` run on ``request``, in its own process, with a timeout."""
    done = subprocess.run(
        [sys.executable, "-m", "tests.remote.native_footers_child"],
        input=json.dumps(request),
        capture_output=True,
        text=True,
        timeout=120,
        cwd=Path(__file__).resolve().parents[2],
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    answer: dict[str, Any] = json.loads(done.stdout.splitlines()[-1])
    return answer


def test_real_world_footers_read_natively_give_the_facts_the_bytes_give(
    seaweedfs: SeaweedFS,
) -> None:
    paths = sorted(CORPUS.rglob("*.parquet"))
    assert len(paths) > 50, f"the real-world corpus is missing at {CORPUS}"
    fs = seaweedfs.filesystem()
    files = []
    for k, path in enumerate(paths):
        key = f"{BUCKET}/corpus/{k:03d}-{path.name}"
        fs.put_file(str(path), key)
        files.append((key, path.stat().st_size))
    answer = _child({"storage_options": seaweedfs.s3fs_options(), "files": files})
    assert answer["differing"] == [], answer["differing"][:3]
    # pyarrow reads most of them: the rest are files it refuses, read again as bytes.
    assert len(answer["native"]) >= 0.8 * len(files), (len(answer["native"]), len(files))


def test_a_file_that_is_not_parquet_is_named_as_the_byte_path_names_it(
    seaweedfs: SeaweedFS, many: str
) -> None:
    fs = seaweedfs.filesystem()
    bad = f"{BUCKET}/bad/notes.parquet"
    fs.put_file(__file__, bad)
    answer = _child(
        {"storage_options": seaweedfs.s3fs_options(), "files": [[bad, fs.info(bad)["size"]]]}
    )
    assert answer["differing"] == [] and answer["native"] == [], answer
    # Among enough good files to be read natively (the first file's schema is read apart).
    paths = [f"{many}/part-{i:04d}.parquet" for i in range(FILES)] + [f"s3://{bad}"]
    script = (
        "import sys, torch_dataloader_utils as tdu\n"
        "try:\n"
        f"    tdu.create_dataloader({paths!r}, storage_options={seaweedfs.s3fs_options()!r})\n"
        "except tdu.CorruptFileError as exc:\n"
        "    print(exc)\n"
        "    sys.exit(0)\n"
        "sys.exit(3)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, (done.returncode, done.stderr[-3000:])
    assert done.stdout.startswith(f"s3://{bad}: not Parquet: this looks like CSV/JSON text"), (
        done.stdout
    )


def test_a_table_files_footer_is_read_by_pyarrow_at_the_size_its_table_told(
    seaweedfs: SeaweedFS, many: str, fault_proxy: MakeProxy
) -> None:
    """`footer.file_metadata` of an Iceberg or Delta data file, whose size the table's metadata
    tells: one GET by pyarrow's client; at a wrong size, read again as bytes at the size the store
    tells."""
    import pyarrow.dataset  # noqa: F401  (the table kinds load it; only then is it used)

    proxy = _recording(fault_proxy)
    fs = FileSystemSpec("s3", seaweedfs.s3fs_options(endpoint_url=proxy.endpoint_url))
    path = f"{BUCKET}/many/part-0007.parquet"
    size = seaweedfs.filesystem().info(path)["size"]
    expected = pq.ParquetFile(pa.BufferReader(seaweedfs.filesystem().cat_file(path))).metadata
    proxy.agents.clear()
    assert file_metadata(path, fs, size).equals(expected)
    assert _clients(proxy) == Counter({("GET", "pyarrow"): 1}), _clients(proxy)
    proxy.agents.clear()
    assert file_metadata(path, fs, size + 10).equals(expected)
    # pyarrow's read failed; the bytes were read at the size the store told (a HEAD).
    assert _clients(proxy) == Counter({("GET", "pyarrow"): 2, ("HEAD", "pyarrow"): 1})


def test_many_footers_on_gcs_are_read_by_pyarrow_and_plan_alike(
    request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Through pyarrow's GCS client (fake-gcs-server; the proxy cannot stand in front of it,
    so the footers read natively are counted where they are read)."""
    server = request.getfixturevalue("gcs_server")
    bucket = "tdu-native-footers-gcs"
    server.create_bucket(bucket)
    fs = server.filesystem()
    for i in range(FILES):
        with fs.open(f"{bucket}/many/part-{i:04d}.parquet", "wb") as out:
            pq.write_table(_table(i), out, row_group_size=16)
    read = Counter[bool]()
    native_footer = parquet_facts._native_footer

    def counted(*args: Any, **kwargs: Any) -> Any:
        found = native_footer(*args, **kwargs)
        read[found is not None] += 1
        return found

    monkeypatch.setattr(parquet_facts, "_native_footer", counted)
    url = f"gs://{bucket}/many"
    loaders = [
        tdu.create_dataloader(
            url,
            storage_options=server.gcsfs_options(),
            storage_backend=backend,
            batch_size=64,
            num_workers=0,
        )
        for backend in ("auto", "fsspec")
    ]
    assert read == Counter({True: FILES}), read  # (through fsspec: read as bytes)
    assert loaders[0].dataset.plan.fingerprint == loaders[1].dataset.plan.fingerprint
    got = Counter(i for batch in loaders[0] for i in batch["id"].tolist())
    assert got == Counter(range(FILES * ROWS))
