"""``FileSystemSpec`` storage options: a mapping or a function called in each process (again
after ``refresh``, and once more when a request is refused), range reads with retries, pickling,
and secrets never shown."""

from __future__ import annotations

import errno
import functools
import logging
import os
import pickle
import uuid
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, ClassVar

import fsspec
import pyarrow.fs as pafs
import pytest
from fsspec.implementations.memory import MemoryFileSystem
from torch.utils.data import DataLoader, IterableDataset, get_worker_info

from torch_dataloader_utils.errors import InvalidArgumentError, StorageError
from torch_dataloader_utils.fs import FileSystemSpec, RetryPolicy
from torch_dataloader_utils.fs import spec as spec_module

SECRET = "s3cr3t-value-never-shown"
FAST = RetryPolicy(max_attempts=3, initial_delay=0.001, max_delay=0.001)


# --- a storage that checks a credential --------------------------------------------------------


class TokenMemoryFileSystem(MemoryFileSystem):
    """fsspec's in-memory filesystem (same store), refusing reads whose ``token`` storage option
    is not the currently valid one, as an object store refuses an expired credential; and
    failing the next ``transient`` reads with a dropped connection."""

    protocol = "tdu-token-memory"
    valid: ClassVar[str] = "t1"
    transient: ClassVar[int] = 0

    def cat_file(self, path: str, start: int | None = None, end: int | None = None, **kw: Any):  # type: ignore[no-untyped-def]
        if self.storage_options.get("token") != TokenMemoryFileSystem.valid:
            raise PermissionError(errno.EACCES, "The provided token has expired", path)
        if TokenMemoryFileSystem.transient > 0:
            TokenMemoryFileSystem.transient -= 1
            raise ConnectionResetError(errno.ECONNRESET, "Connection reset by peer")
        return super().cat_file(path, start=start, end=end, **kw)


fsspec.register_implementation(TokenMemoryFileSystem.protocol, TokenMemoryFileSystem, clobber=True)


@pytest.fixture
def token_store(monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """A file on the token-checking filesystem (valid token: "t1"); returns its path."""
    monkeypatch.setattr(TokenMemoryFileSystem, "valid", "t1")
    monkeypatch.setattr(TokenMemoryFileSystem, "transient", 0)
    root = f"/tdu-cred-{uuid.uuid4().hex}"
    mem = fsspec.filesystem("memory")
    mem.pipe(f"{root}/blob.bin", bytes(range(200)))
    yield f"{root}/blob.bin"
    mem.rm(root, recursive=True)


def token_from(path: Path) -> dict[str, str]:
    """Storage options from a credentials file (module level: picklable), counting calls."""
    with open(f"{path}.calls", "a") as log:
        log.write(f"{os.getpid()}\n")
    return {"token": path.read_text()}


def calls_of(path: Path) -> list[int]:
    log = Path(f"{path}.calls")
    return [int(line) for line in log.read_text().split()] if log.exists() else []


@pytest.fixture
def credentials(tmp_path: Path) -> Path:
    path = tmp_path / "token"
    path.write_text("t1")
    return path


# --- the options function ----------------------------------------------------------------------


def test_function_is_called_once_per_process_and_again_after_refresh(credentials: Path) -> None:
    spec = FileSystemSpec("memory", functools.partial(token_from, credentials))
    assert spec.refreshable
    assert calls_of(credentials) == []  # lazily: not at construction
    assert spec.storage_options == {"token": "t1"}
    assert spec.storage_options == {"token": "t1"}
    assert spec.fsspec().storage_options == {"token": "t1"}
    assert calls_of(credentials) == [os.getpid()]
    credentials.write_text("t2")
    assert spec.storage_options == {"token": "t1"}  # cached until refreshed
    spec.refresh()
    assert spec.storage_options == {"token": "t2"}
    assert spec.fsspec().storage_options == {"token": "t2"}  # filesystems rebuilt
    assert calls_of(credentials) == [os.getpid()] * 2


def test_mapping_options_are_copied_and_not_refreshable() -> None:
    options = {"token": SECRET}
    spec = FileSystemSpec("memory", options)
    options["token"] = "changed"
    assert spec.storage_options == {"token": SECRET}
    assert not spec.refreshable
    assert FileSystemSpec("memory").storage_options == {}


def test_bad_options_are_refused() -> None:
    with pytest.raises(InvalidArgumentError, match="mapping or a function"):
        FileSystemSpec("memory", [("token", SECRET)])  # type: ignore[arg-type]
    spec = FileSystemSpec("memory", lambda: [("token", SECRET)])
    with pytest.raises(InvalidArgumentError, match="must return a mapping, got list") as info:
        spec.storage_options  # noqa: B018
    assert SECRET not in str(info.value)
    with pytest.raises(InvalidArgumentError, match="storage_backend"):
        FileSystemSpec("memory", backend="native")  # type: ignore[arg-type]


def test_native_decision_and_filesystem_follow_the_function(tmp_path: Path) -> None:
    credentials = tmp_path / "key"
    credentials.write_text("AKIA1")

    spec = FileSystemSpec("s3", functools.partial(s3_options, credentials))
    assert spec.native
    assert config(spec.arrow())["access_key"] == "AKIA1"
    credentials.write_text("AKIA2")
    spec.refresh()
    assert config(spec.arrow())["access_key"] == "AKIA2"  # rotated credentials reach native
    # A function whose options do not translate makes "auto" use fsspec.
    odd = FileSystemSpec("s3", lambda: {"anon": True, "requester_pays": True})
    assert not odd.native
    assert isinstance(odd.arrow(), pafs.PyFileSystem)


def s3_options(path: Path) -> dict[str, str]:
    return {"key": path.read_text(), "secret": SECRET, "region_name": "eu-central-1"}


def config(fs: pafs.FileSystem) -> dict[str, Any]:
    return fs.__reduce__()[1][0]  # type: ignore[no-any-return]


# --- secrets never shown -----------------------------------------------------------------------


def test_repr_shows_keys_never_values(credentials: Path) -> None:
    mapping = FileSystemSpec(
        "s3", {"secret": SECRET, "key": "AKIA", "client_kwargs": {"token": SECRET}}
    )
    for text in (repr(mapping), str(mapping), f"{mapping}", f"{[mapping]}"):
        assert SECRET not in text and "AKIA" not in text
    assert repr(mapping) == (
        "FileSystemSpec(protocol='s3', storage_options=<client_kwargs, key, secret>, "
        "backend='auto')"
    )
    credentials.write_text(SECRET)
    function = FileSystemSpec("gs", functools.partial(token_from, credentials), backend="fsspec")
    function.storage_options  # noqa: B018 - called: the cached options hold the secret now
    assert SECRET not in repr(function)
    assert repr(function) == (
        "FileSystemSpec(protocol='gs', storage_options=<function>, backend='fsspec')"
    )
    assert repr(FileSystemSpec("file")) == (
        "FileSystemSpec(protocol='file', storage_options=<none>, backend='auto')"
    )


def test_pickle_of_a_function_spec_holds_the_reference_not_the_secret(
    credentials: Path,
) -> None:
    credentials.write_text(SECRET)
    spec = FileSystemSpec("memory", functools.partial(token_from, credentials))
    assert spec.storage_options == {"token": SECRET}
    blob = pickle.dumps(spec)
    assert SECRET.encode() not in blob  # the options fetched are not pickled
    copy = pickle.loads(blob)
    assert copy.storage_options == {"token": SECRET}  # called again after unpickling
    assert len(calls_of(credentials)) == 2
    # A mapping has nothing to fetch again: its values travel in the pickle (to the workers).
    assert SECRET.encode() in pickle.dumps(FileSystemSpec("memory", {"token": SECRET}))


def test_getstate_carries_arguments_policy_and_counter() -> None:
    policy = RetryPolicy(max_attempts=2, initial_delay=0.5)
    spec = FileSystemSpec("memory", token_from, backend="fsspec", retry=policy)
    state = spec.__getstate__()
    assert state == {
        "protocol": "memory",
        "storage_options": token_from,
        "backend": "fsspec",
        "retry": policy,
        "retries": spec.retries,
    }
    spec.retries.add(3)
    copy = pickle.loads(pickle.dumps(spec))
    assert copy == spec  # a module-level function pickles by reference: equal
    assert (copy.backend, copy.retry, copy.retries.total) == ("fsspec", policy, 3)
    partial = FileSystemSpec("memory", functools.partial(token_from, Path("x")))
    again = pickle.loads(pickle.dumps(partial))
    assert again.protocol == "memory" and again.refreshable
    # functools.partial compares by identity, so a copy is never == its original.
    assert again != partial


def test_lambda_options_do_not_pickle() -> None:
    spec = FileSystemSpec("memory", lambda: {"token": SECRET})
    # What happens: pickling fails, clearly naming the function (a spawn DataLoader fails the
    # same way, in the main process, when it starts its first worker). Fork workers inherit the
    # object without pickling, so a lambda works there.
    with pytest.raises((pickle.PicklingError, AttributeError), match="lambda"):
        pickle.dumps(spec)


# --- in each DataLoader worker process ---------------------------------------------------------


class OptionsDataset(IterableDataset[tuple[int, int]]):
    """Yields (worker pid, pid the storage options came from); module level: spawn imports it."""

    def __init__(self, spec: FileSystemSpec) -> None:
        self.spec = spec

    def __iter__(self) -> Iterator[tuple[int, int]]:
        assert get_worker_info() is not None
        yield os.getpid(), self.spec.storage_options["pid"]


def pid_options(path: Path) -> dict[str, int]:
    with open(path, "a") as log:
        log.write(f"{os.getpid()}\n")
    return {"pid": os.getpid()}


@pytest.mark.parametrize("context", ["fork", "spawn"])
def test_function_is_called_in_each_worker(tmp_path: Path, context: str) -> None:
    log = tmp_path / "calls"
    spec = FileSystemSpec("memory", functools.partial(pid_options, log))
    assert spec.storage_options["pid"] == os.getpid()  # the main process uses it first
    loader = DataLoader(
        OptionsDataset(spec), batch_size=None, num_workers=2, multiprocessing_context=context
    )
    seen = list(loader)
    workers = {pid for pid, _ in seen}
    assert len(workers) == 2 and os.getpid() not in workers
    # Each worker got options from its own call, not the main process's (fork included).
    assert all(source == pid for pid, source in seen)
    assert sorted(int(p) for p in log.read_text().split()) == sorted([os.getpid(), *workers])


def test_forked_worker_rebuilds_cached_files(tmp_path: Path) -> None:
    paths = []
    for i in range(3):
        path = tmp_path / f"f{i}.bin"
        path.write_bytes(bytes([i]) * 16)
        paths.append(str(path))
    spec = FileSystemSpec("file")
    for path in paths:
        assert spec.read_range(path, 0, 4) == bytes([paths.index(path)]) * 4
    assert len(spec._local.get().files) == 3

    class Probe(IterableDataset[tuple[int, bytes]]):
        def __iter__(self) -> Iterator[tuple[int, bytes]]:
            data = spec.read_range(paths[2], 8, 4)
            yield len(spec._local.get().files), data

    ((open_files, data),) = list(
        DataLoader(Probe(), batch_size=None, num_workers=1, multiprocessing_context="fork")
    )
    # The worker dropped the three files opened in the main process and opened its own one.
    assert (open_files, data) == (1, b"\x02" * 4)
    assert len(spec._local.get().files) == 3  # the main process's cache is untouched


# --- read_range: retries and refused credentials -----------------------------------------------


def token_spec(credentials: Path | None = None, **kw: Any) -> FileSystemSpec:
    options: Mapping[str, Any] | functools.partial[dict[str, str]] = (
        functools.partial(token_from, credentials) if credentials is not None else {"token": "t1"}
    )
    return FileSystemSpec(TokenMemoryFileSystem.protocol, options, retry=FAST, **kw)


def test_read_range_reads_exact_bytes(token_store: str) -> None:
    spec = token_spec()
    assert not spec.native
    assert spec.read_range(token_store, 10, 5) == bytes(range(10, 15))
    assert spec.read_range(token_store, 0, 200) == bytes(range(200))
    with pytest.raises(OSError, match="got 10 bytes, the object is shorter than expected"):
        spec.read_range(token_store, 190, 20)


def test_read_range_retries_transient_failures_without_logging_secrets(
    token_store: str, credentials: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="torch_dataloader_utils.storage")
    credentials.write_text("t1")
    spec = token_spec(credentials)
    TokenMemoryFileSystem.transient = 2
    assert spec.read_range(token_store, 0, 8) == bytes(range(8))
    assert spec.retries.total == 2
    messages = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(messages) == 2
    url = f"{TokenMemoryFileSystem.protocol}://{token_store} bytes 0-7"
    assert all(m.startswith(url) for m in messages)
    assert all("t1" not in m.replace(token_store, "") for m in messages)
    # Exhausted: a StorageError naming the URL and range.
    TokenMemoryFileSystem.transient = 10
    with pytest.raises(StorageError, match=r"bytes 0-7: failed after 3 attempt\(s\)"):
        spec.read_range(token_store, 0, 8)
    assert spec.retries.total == 4


def test_refused_credential_fetches_options_again_once(
    token_store: str, credentials: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    spec = token_spec(credentials)
    assert spec.read_range(token_store, 0, 4) == bytes(range(4))
    assert len(calls_of(credentials)) == 1
    # The credential rotates: the cached token is refused, the function gives the new one.
    monkeypatch.setattr(TokenMemoryFileSystem, "valid", "t2")
    credentials.write_text("t2")
    assert spec.read_range(token_store, 4, 4) == bytes(range(4, 8))
    assert len(calls_of(credentials)) == 2
    assert spec.retries.total == 0  # a refusal is not a retry of a transient failure
    # Still refused after fetching again: the PermissionError is raised (one refresh only).
    monkeypatch.setattr(TokenMemoryFileSystem, "valid", "t3")
    with pytest.raises(PermissionError, match="expired"):
        spec.read_range(token_store, 0, 4)
    assert len(calls_of(credentials)) == 3


def test_refused_credential_with_mapping_fails_at_once(
    token_store: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    spec = token_spec()
    monkeypatch.setattr(TokenMemoryFileSystem, "valid", "other")
    with pytest.raises(PermissionError):
        spec.read_range(token_store, 0, 4)
    assert spec.retries.total == 0


def test_native_local_read_range_caches_a_few_open_files(tmp_path: Path) -> None:
    spec = FileSystemSpec("file")
    paths = []
    kept = spec_module._OPEN_FILES
    for i in range(kept + 2):
        path = tmp_path / f"{i}.bin"
        path.write_bytes(bytes([i % 256]) * 64)
        paths.append(str(path))
    for i, path in enumerate(paths):
        assert spec.read_range(path, 10, 3) == bytes([i % 256]) * 3
    # At most `_OPEN_FILES`, the least recently used dropped.
    assert list(spec._local.get().files) == paths[-kept:]
    with pytest.raises(FileNotFoundError):
        spec.read_range(str(tmp_path / "missing.bin"), 0, 1)
