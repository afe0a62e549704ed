"""``FileSystemSpec``: picklable through its arguments; secrets never in ``repr``."""

from __future__ import annotations

import os
import pickle
from pathlib import Path

import pyarrow.fs as pafs
import pytest

from torch_dataloader_utils.fs import FileSystemSpec

SECRET = "s3cr3t"
OPTIONS = {"key": "AKIAEXAMPLE", "secret": SECRET, "client_kwargs": {"token": SECRET}}


def test_pickle_round_trip_is_equal() -> None:
    for spec in [
        FileSystemSpec("file"),
        FileSystemSpec("memory", {"a": 1}),
        FileSystemSpec("s3", OPTIONS),
    ]:
        for protocol in range(pickle.HIGHEST_PROTOCOL + 1):
            copy = pickle.loads(pickle.dumps(spec, protocol=protocol))
            assert copy == spec
            assert copy.protocol == spec.protocol
            assert copy.storage_options == spec.storage_options
            assert hash(copy) == hash(spec)


def test_cached_filesystems_are_not_pickled_and_are_rebuilt() -> None:
    spec = FileSystemSpec("memory", {"marker": "m"})
    built = spec.fsspec()
    arrow = spec.arrow()
    assert isinstance(arrow, pafs.PyFileSystem)
    blob = pickle.dumps(spec)
    # The pickle carries the arguments only: neither filesystem object's class is in it.
    assert b"MemoryFileSystem" not in blob
    assert b"PyFileSystem" not in blob
    copy = pickle.loads(blob)
    state = copy.__getstate__()
    assert (state["protocol"], state["storage_options"]) == ("memory", {"marker": "m"})
    assert state["backend"] == "auto"
    rebuilt = copy.fsspec()
    assert rebuilt.storage_options == built.storage_options
    assert isinstance(copy.arrow(), pafs.PyFileSystem)
    # The caches are per object: built once, then reused.
    assert copy.fsspec() is rebuilt
    assert spec.fsspec() is built


def test_local_spec_pickles_and_reads_after_unpickling(tmp_path: Path) -> None:
    (tmp_path / "f.txt").write_bytes(b"hello")
    spec = FileSystemSpec.for_path(str(tmp_path))
    spec.arrow()
    copy = pickle.loads(pickle.dumps(spec))
    assert isinstance(copy.arrow(), pafs.LocalFileSystem)
    with copy.arrow().open_input_file(str(tmp_path / "f.txt")) as f:
        assert f.read() == b"hello"


def test_repr_never_shows_option_values() -> None:
    spec = FileSystemSpec("s3", OPTIONS)
    for text in [repr(spec), str(spec), f"{spec}", repr([spec]), repr({"fs": spec})]:
        assert SECRET not in text
        assert "AKIAEXAMPLE" not in text
    # The option names are shown, so a user can see which options are set.
    assert "secret" in repr(spec)
    assert "key" in repr(spec)
    assert "s3" in repr(spec)
    assert SECRET not in repr(FileSystemSpec("s3"))


def test_equality_depends_on_protocol_and_options() -> None:
    assert FileSystemSpec("file") == FileSystemSpec("local")
    assert FileSystemSpec("s3", {"a": 1}) != FileSystemSpec("s3", {"a": 2})
    assert FileSystemSpec("s3") != FileSystemSpec("gs")
    assert FileSystemSpec("s3") != "s3"
    # Options are copied: changing the caller's dict later does not change the spec.
    options = {"a": 1}
    spec = FileSystemSpec("s3", options)
    options["a"] = 2
    assert spec.storage_options == {"a": 1}


def test_for_path_picks_the_protocol() -> None:
    assert FileSystemSpec.for_path("/data/x.parquet").protocol == "file"
    assert FileSystemSpec.for_path(Path("rel/x.parquet")).protocol == "file"
    assert FileSystemSpec.for_path("file:///data/x").protocol == "file"
    assert FileSystemSpec.for_path("memory://b/k").protocol == "memory"
    spec = FileSystemSpec.for_path("s3://bucket/k", {"anon": True})
    assert (spec.protocol, spec.storage_options) == ("s3", {"anon": True})
    assert FileSystemSpec.for_path("/x").is_local
    assert not FileSystemSpec.for_path("memory://x").is_local


def test_strip_local_paths_become_absolute(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    bare = FileSystemSpec("file").strip
    assert bare(f"file://{tmp_path}/a.parquet") == f"{tmp_path}/a.parquet"
    assert bare(tmp_path / "a.parquet") == f"{tmp_path}/a.parquet"
    assert bare(f"{tmp_path}/sub/../a.parquet") == f"{tmp_path}/a.parquet"
    monkeypatch.chdir(tmp_path)
    assert bare("rel/a.parquet") == os.path.join(str(tmp_path), "rel", "a.parquet")
    assert bare("~/x") == os.path.join(os.path.expanduser("~"), "x")


def test_url_and_strip_round_trip() -> None:
    local = FileSystemSpec("file")
    assert local.url("/data/a.parquet") == "/data/a.parquet"
    memory = FileSystemSpec("memory")
    bare = memory.strip
    stripped = bare("memory://bucket/dir/a.parquet")
    assert "memory://" not in stripped
    assert stripped.endswith("bucket/dir/a.parquet")
    assert memory.url(stripped).startswith("memory://")
    assert bare(memory.url(stripped)) == stripped
