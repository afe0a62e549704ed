"""`fs.hub`: Hub paths parsed, listed at a commit, opened and read by ranged GETs, retried on
429/5xx as Retry-After says; against the local Hub server (`tests.services.hub`)."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator

import pytest

from tests.services.hub import HubServer
from torch_dataloader_utils.errors import (
    InvalidSourceError,
    MissingDependencyError,
    StorageError,
    StorageNotFoundError,
)
from torch_dataloader_utils.fs import FileSystemSpec, RetryPolicy, list_files
from torch_dataloader_utils.fs.hub import (
    TAIL_BYTES,
    HubPath,
    _retry_after,
    open_hub,
    pinned_at_commit,
    read_hub_range,
)
from torch_dataloader_utils.fs.hub_listing import commit_details
from torch_dataloader_utils.fs.identity import check_identity

SHA = "0123456789abcdef0123456789abcdef01234567"


@pytest.mark.parametrize(
    ("path", "expected"),
    [
        (
            "datasets/org/name/data/*.parquet",
            HubPath("datasets", "org/name", None, "data/*.parquet"),
        ),
        ("datasets/org/name@v1.0/a/b", HubPath("datasets", "org/name", "v1.0", "a/b")),
        (
            "datasets/org/name@refs%2Fconvert%2Fparquet/default/x.parquet",
            HubPath("datasets", "org/name", "refs/convert/parquet", "default/x.parquet"),
        ),
        (
            "datasets/org/name@refs/convert/parquet/default",
            HubPath("datasets", "org/name", "refs/convert/parquet", "default"),
        ),
        ("datasets/org/name@refs/pr/3/x", HubPath("datasets", "org/name", "refs/pr/3", "x")),
        ("org/model@main/w.bin", HubPath("models", "org/model", "main", "w.bin")),
        ("gpt2@abc/w.bin", HubPath("models", "gpt2", "abc", "w.bin")),
        ("datasets/org/name", HubPath("datasets", "org/name", None, "")),
    ],
)
def test_parse(path: str, expected: HubPath) -> None:
    assert HubPath.parse(path) == expected


def test_parse_refuses_a_path_without_a_repository() -> None:
    with pytest.raises(InvalidSourceError, match="names no repository"):
        HubPath.parse("datasets/org")


def test_pinned_commit_and_details() -> None:
    assert pinned_at_commit(f"datasets/org/n@{SHA}/x.parquet") == SHA
    assert pinned_at_commit("datasets/org/n@main/x.parquet") is None
    assert pinned_at_commit("datasets/org/n/x.parquet") is None
    files = [f"datasets/org/n@{SHA}/{i}.parquet" for i in range(2)]
    assert commit_details("hf", files) == {"commit": SHA}
    assert commit_details("s3", files) == {}
    other = "f" * 40
    both = [*files, f"datasets/org/m@{other}/x.parquet"]
    assert commit_details("hf", both) == {"commit": f"{SHA},{other}"}


@pytest.mark.parametrize(
    ("value", "expected"),
    [("0", 0.0), ("2", 2.0), (" 1.5 ", 1.5), ("", None), ("Wed, 21 Oct", None)],
)
def test_retry_after(value: str, expected: float | None) -> None:
    assert _retry_after({"Retry-After": value}) == expected


@pytest.fixture(scope="module")
def server() -> Iterator[HubServer]:
    hub = HubServer(page_size=2)
    hub.create(
        "org/unit",
        {
            ".gitattributes": b"*.parquet filter=lfs\n",
            "data/a.bin": bytes(range(256)) * 400,  # larger than TAIL_BYTES
            "data/b.bin": b"small",
            "data/_meta/c.bin": b"hidden",
            "data/deep/d.bin": b"deep",
            "README.md": b"# unit\n",
        },
    )
    yield hub
    hub.stop()


def spec_of(hub: HubServer, attempts: int = 3) -> FileSystemSpec:
    retry = RetryPolicy(max_attempts=attempts, initial_delay=0.01, max_delay=0.02)
    return FileSystemSpec("hf", {"endpoint": hub.endpoint}, retry=retry)


def test_listing(server: HubServer) -> None:
    server.reset()
    spec = spec_of(server)
    commit = server.repos["org/unit"].refs["main"]
    at = f"datasets/org/unit@{commit}"
    files = list_files("hf://datasets/org/unit/data", spec)
    assert [f.path for f in files] == [
        f"{at}/data/a.bin",
        f"{at}/data/b.bin",
        f"{at}/data/deep/d.bin",
    ]
    assert all(f.base == f"{at}/data" and f.version.startswith("oid=") for f in files)
    assert files[1].size == 5
    # (the file named is listed from its folder's page: info, then two pages of data/ ...)
    assert server.counts["info"] == 1 and server.counts["paths-info"] == 0
    files = list_files("hf://datasets/org/unit/**/*.bin", spec)
    assert [f.path.rsplit("/", 1)[1] for f in files] == ["a.bin", "b.bin", "d.bin"]
    files = list_files("hf://datasets/org/unit/data/*.bin", spec)
    assert [f.path.rsplit("/", 1)[1] for f in files] == ["a.bin", "b.bin"]
    files = list_files("hf://datasets/org/unit/.gitattributes", spec)  # named: read
    assert [f.size for f in files] == [21]
    with pytest.raises(InvalidSourceError, match="matched no files"):
        list_files("hf://datasets/org/unit/data/*.parquet", spec)
    with pytest.raises(StorageNotFoundError, match=r"data/x\.bin"):
        list_files("hf://datasets/org/unit/data/x.bin", spec)


def test_open_and_read(server: HubServer) -> None:
    spec = spec_of(server)
    commit = server.repos["org/unit"].refs["main"]
    data = bytes(range(256)) * 400
    path = f"datasets/org/unit@{commit}/data/a.bin"
    server.reset()
    # Size unknown: one GET of the last TAIL_BYTES tells it and serves reads of them.
    with open_hub(spec, path, None) as f:
        assert f.size() == len(data)
        assert f.read_at(100, len(data) - 100) == data[-100:]
        assert server.counts["resolve"] == 1
        assert f.read_at(10, 5) == data[5:15]
        assert server.counts["resolve"] == 2
    assert read_hub_range(spec, path, 1000, 7) == data[1000:1007]
    assert len(data) > TAIL_BYTES
    small = f"datasets/org/unit@{commit}/data/b.bin"
    with open_hub(spec, small, None) as f:
        assert f.size() == 5 and f.read() == b"small"
    # A file at a commit is never checked again: no request.
    before = sum(server.counts.values())
    check_identity(path, (len(data), "oid=whatever"), spec)
    assert sum(server.counts.values()) == before
    assert set(server.counts) == {"resolve"}


def test_retries(server: HubServer) -> None:
    spec = spec_of(server, attempts=3)
    commit = server.repos["org/unit"].refs["main"]
    path = f"datasets/org/unit@{commit}/data/b.bin"
    server.reset()
    server.inject("resolve", 2, status=503, retry_after=None)  # a backoff
    assert read_hub_range(spec, path, 0, 5) == b"small"
    assert server.faulted["resolve"] == 2 and spec.retries.total == 2
    server.inject("resolve", 3, status=429)  # more than the attempts
    with pytest.raises(StorageError, match="429"):
        spec.read_range(path, 0, 5)
    assert server.counts["resolve"] == 6  # never retried again above (final)
    with pytest.raises(StorageNotFoundError, match=r"nope\.bin"):
        spec.read_range(f"datasets/org/unit@{commit}/nope.bin", 0, 1)


def test_without_huggingface_hub(server: HubServer, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "huggingface_hub", None)
    with pytest.raises(MissingDependencyError, match=r"torch-dataloader-utils\[hf\]"):
        list_files("hf://datasets/org/unit/data", spec_of(server))


def test_importing_the_package_imports_no_hub_client() -> None:
    code = "import sys, torch_dataloader_utils; print('huggingface_hub' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
