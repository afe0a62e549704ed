"""``list_files``: deterministic expansion of a source into files
(docs/concepts/architecture.md)."""

from __future__ import annotations

import logging
import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import fsspec
import pytest

import torch_dataloader_utils as tdu
from torch_dataloader_utils.errors import (
    InvalidSourceError,
    StorageNotFoundError,
    TorchDataloaderUtilsError,
)
from torch_dataloader_utils.fs import FileSystemSpec, ListedFile, list_files

LOCAL = FileSystemSpec("file")


def touch(root: Path, *relative: str, size: int = 3) -> None:
    """Create files of ``size`` bytes under ``root``."""
    for rel in relative:
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"x" * size)


def paths(files: list[ListedFile], root: Path | str) -> list[str]:
    """The files' paths relative to ``root``, in the order listed."""
    return [os.path.relpath(f.path, root) for f in files]


# --- directories ---------------------------------------------------------------------------


def test_directory_is_listed_recursively_in_sorted_order(tmp_path: Path) -> None:
    # Created out of order, with nesting, so the listing's order is its own doing.
    names = [
        "b/2.parquet",
        "a.parquet",
        "c/d/e.parquet",
        "b/10.parquet",
        "b/1.parquet",
        "z.parquet",
    ]
    touch(tmp_path, *names)
    files = list_files(tmp_path, LOCAL)
    assert paths(files, tmp_path) == sorted(names)
    assert all(f.base == str(tmp_path) for f in files)
    assert all(os.path.isabs(f.path) for f in files)


def test_sizes_are_the_real_file_sizes(tmp_path: Path) -> None:
    for i, size in enumerate([0, 1, 4096]):
        touch(tmp_path, f"f{i}.bin", size=size)
    files = list_files(str(tmp_path), LOCAL)
    assert [f.size for f in files] == [os.path.getsize(f.path) for f in files] == [0, 1, 4096]


def test_str_pathlike_and_trailing_slash_give_the_same_listing(tmp_path: Path) -> None:
    touch(tmp_path, "x/a.parquet", "x/b.parquet")
    expected = list_files(tmp_path / "x", LOCAL)
    assert list_files(str(tmp_path / "x"), LOCAL) == expected
    assert list_files(str(tmp_path / "x") + "/", LOCAL) == expected


def test_hidden_and_marker_entries_are_skipped_inside_directories(tmp_path: Path) -> None:
    touch(
        tmp_path,
        "a.parquet",
        ".x",
        ".hidden/b.parquet",
        "_SUCCESS",
        "_metadata",
        "_temporary/0/c.parquet",
        "sub/.crc",
        "sub/_SUCCESS",
        "sub/d.parquet",
        # Underscores and dots inside a name are not markers.
        "part_1.parquet",
        "v1.2/e.parquet",
    )
    files = list_files(tmp_path, LOCAL)
    assert paths(files, tmp_path) == [
        "a.parquet",
        "part_1.parquet",
        "sub/d.parquet",
        "v1.2/e.parquet",
    ]


def test_a_directory_under_a_hidden_parent_is_read_when_named(tmp_path: Path) -> None:
    # Only what lies below the named directory is checked for hidden parts.
    touch(tmp_path, ".cache/_stage/data/a.parquet")
    files = list_files(tmp_path / ".cache" / "_stage" / "data", LOCAL)
    assert paths(files, tmp_path) == [".cache/_stage/data/a.parquet"]


def test_explicitly_named_hidden_files_are_read(tmp_path: Path) -> None:
    touch(tmp_path, ".x", "_SUCCESS", "_temporary/c.parquet")
    for rel in [".x", "_SUCCESS", "_temporary/c.parquet"]:
        files = list_files(tmp_path / rel, LOCAL)
        assert paths(files, tmp_path) == [rel]
        assert files[0].base == str((tmp_path / rel).parent)


def _as_fsspec_lists(root: Path) -> list[ListedFile]:
    """What listing a local directory gave through fsspec's ``find`` (before the local walk)."""
    from torch_dataloader_utils.fs.identity import version_of
    from torch_dataloader_utils.fs.listing import _is_hidden, _relative

    base = str(root)
    found = fsspec.filesystem("file").find(base, detail=True)
    return [
        ListedFile(p, int(i.get("size") or 0), base, version_of(i))
        for p, i in sorted(found.items())
        if i.get("type") == "file" and not _is_hidden(_relative(p, base))
    ]


def test_a_local_directory_lists_as_fsspec_find_does(tmp_path: Path) -> None:
    touch(tmp_path, "a=1/b=x/f1.parquet", "a=1/f0", "z/ä ü.parquet", "top", "a=1/b=x/.f2")
    touch(tmp_path, ".hidden/x", "_tmp/y", "_SUCCESS", ".crc", "z/_meta", "deep/" * 12 + "f")
    touch(tmp_path, "A", "a-b/c", "ab/c", "a.b", "a0", size=5)  # sort order of close names
    os.symlink(tmp_path / "top", tmp_path / "link-to-file")  # links: not listed, as fsspec
    os.symlink(tmp_path / "z", tmp_path / "link-to-dir")
    os.symlink(tmp_path / "nowhere", tmp_path / "broken")
    os.mkfifo(tmp_path / "fifo")
    listed = list_files(str(tmp_path), LOCAL)
    assert listed == _as_fsspec_lists(tmp_path)
    assert "z/ä ü.parquet" in paths(listed, tmp_path)
    assert all(f.version.startswith("mtime=") and f.base == str(tmp_path) for f in listed)


def test_an_unreadable_local_subdirectory_is_left_out_as_fsspec_does(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    touch(tmp_path, "ok/f", "locked/g")
    scandir = os.scandir

    def refusing(path: str) -> Iterator[os.DirEntry[str]]:
        if str(path).endswith("locked"):
            raise PermissionError(13, "Permission denied", str(path))
        return scandir(path)

    monkeypatch.setattr(os, "scandir", refusing)  # (tests run as root: chmod refuses nothing)
    assert paths(list_files(str(tmp_path), LOCAL), tmp_path) == ["ok/f"]
    assert list_files(str(tmp_path), LOCAL) == _as_fsspec_lists(tmp_path)
    monkeypatch.setattr(os, "scandir", lambda path: refusing(str(path) + "locked"))
    with pytest.raises(PermissionError):  # the directory named: an error, as with fsspec
        list_files(str(tmp_path), LOCAL)


def test_empty_directory_is_an_invalid_source(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    with pytest.raises(InvalidSourceError) as info:
        list_files(tmp_path / "empty", LOCAL)
    assert isinstance(info.value, ValueError)
    assert str(tmp_path / "empty") in str(info.value)


def test_directory_of_only_hidden_files_is_an_invalid_source(tmp_path: Path) -> None:
    touch(tmp_path, "d/_SUCCESS", "d/.x", "d/_temporary/a.parquet")
    with pytest.raises(InvalidSourceError):
        list_files(tmp_path / "d", LOCAL)


# --- globs and brace patterns -----------------------------------------------------------------


def test_glob_matches_sorted_and_skips_hidden(tmp_path: Path) -> None:
    touch(
        tmp_path,
        "b.parquet",
        "a.parquet",
        "c.csv",
        ".d.parquet",
        "_e.parquet",
        "s/f.parquet",
        "_temporary/g.parquet",
    )
    files = list_files(str(tmp_path / "*.parquet"), LOCAL)
    assert paths(files, tmp_path) == ["a.parquet", "b.parquet"]
    assert all(f.base == str(tmp_path) for f in files)
    nested = list_files(str(tmp_path / "*" / "*.parquet"), LOCAL)
    assert paths(nested, tmp_path) == ["s/f.parquet"]


def test_recursive_glob(tmp_path: Path) -> None:
    touch(tmp_path, "a/b/1.parquet", "a/2.parquet", "a/_tmp/3.parquet", "a/b/x.csv")
    files = list_files(str(tmp_path / "a" / "**" / "*.parquet"), LOCAL)
    assert paths(files, tmp_path) == ["a/2.parquet", "a/b/1.parquet"]


def test_unmatched_glob_is_an_invalid_source(tmp_path: Path) -> None:
    touch(tmp_path, "a.parquet", "_b.parquet")
    for pattern in ["*.orc", "_*.parquet", "missing/*.parquet"]:
        with pytest.raises(InvalidSourceError) as info:
            list_files(str(tmp_path / pattern), LOCAL)
        assert isinstance(info.value, ValueError)


def test_numeric_brace_pattern_keeps_zero_padding_and_order(tmp_path: Path) -> None:
    touch(tmp_path, *[f"part-{i:03d}.parquet" for i in range(6)])
    files = list_files(str(tmp_path / "part-{000..003}.parquet"), LOCAL)
    assert paths(files, tmp_path) == [f"part-{i:03d}.parquet" for i in range(4)]
    backwards = list_files(str(tmp_path / "part-{003..001}.parquet"), LOCAL)
    assert paths(backwards, tmp_path) == [
        "part-003.parquet",
        "part-002.parquet",
        "part-001.parquet",
    ]


def test_alternative_brace_pattern_keeps_the_pattern_order(tmp_path: Path) -> None:
    touch(tmp_path, "a/1.parquet", "a/2.parquet", "b/1.parquet", "c/1.parquet")
    files = list_files(str(tmp_path / "{b,a}"), LOCAL)
    assert paths(files, tmp_path) == ["b/1.parquet", "a/1.parquet", "a/2.parquet"]
    globbed = list_files(str(tmp_path / "{a,c}" / "*.parquet"), LOCAL)
    assert paths(globbed, tmp_path) == ["a/1.parquet", "a/2.parquet", "c/1.parquet"]


def test_brace_pattern_naming_a_missing_file_is_not_found(tmp_path: Path) -> None:
    touch(tmp_path, "part-000.parquet", "part-001.parquet")
    with pytest.raises(StorageNotFoundError) as info:
        list_files(str(tmp_path / "part-{000..002}.parquet"), LOCAL)
    assert "part-002.parquet" in str(info.value)


# --- lists ------------------------------------------------------------------------------------


def test_list_keeps_the_users_order(tmp_path: Path) -> None:
    touch(tmp_path, "a.parquet", "b.parquet", "c.parquet", "d/1.parquet", "d/0.parquet")
    source = [
        str(tmp_path / "c.parquet"),
        tmp_path / "d",
        str(tmp_path / "a.parquet"),
        str(tmp_path / "b*.parquet"),
    ]
    files = list_files(source, LOCAL)
    assert paths(files, tmp_path) == [
        "c.parquet",
        "d/0.parquet",
        "d/1.parquet",
        "a.parquet",
        "b.parquet",
    ]


def test_empty_list_is_an_invalid_source() -> None:
    with pytest.raises(InvalidSourceError):
        list_files([], LOCAL)


def test_the_same_file_twice_is_an_invalid_source_naming_it(tmp_path: Path) -> None:
    touch(tmp_path, "a.parquet", "b.parquet")
    a, b = str(tmp_path / "a.parquet"), str(tmp_path / "b.parquet")
    cases = [
        ([b, a, b], b),
        ([b, b], b),
        ([str(tmp_path), a], a),  # a directory and a file inside it
        ([str(tmp_path / "*.parquet"), b], b),
        (str(tmp_path / "{a,a}.parquet"), a),
    ]
    for source, duplicate in cases:
        with pytest.raises(InvalidSourceError) as info:
            list_files(source, LOCAL)
        assert isinstance(info.value, ValueError)
        assert duplicate in str(info.value), (source, str(info.value))
        other = a if duplicate == b else b
        assert other not in str(info.value), (source, str(info.value))


# --- errors and URLs --------------------------------------------------------------------------


def test_missing_path_is_storage_not_found(tmp_path: Path) -> None:
    missing = tmp_path / "nope.parquet"
    with pytest.raises(StorageNotFoundError) as info:
        list_files(missing, LOCAL)
    assert isinstance(info.value, FileNotFoundError)
    assert isinstance(info.value, TorchDataloaderUtilsError)
    assert str(missing) in str(info.value)
    assert info.value.__cause__ is not None
    # A missing entry of a list fails the same way, even after good ones.
    touch(tmp_path, "ok.parquet")
    with pytest.raises(FileNotFoundError):
        list_files([str(tmp_path / "ok.parquet"), str(missing)], LOCAL)


def test_file_urls_list_like_plain_paths(tmp_path: Path) -> None:
    touch(tmp_path, "d/a.parquet", "d/b.parquet", "d/_SUCCESS")
    url = f"file://{tmp_path}/d"
    spec = FileSystemSpec.for_path(url)
    assert spec.is_local
    expected = list_files(tmp_path / "d", LOCAL)
    assert list_files(url, spec) == expected
    assert list_files(f"file://{tmp_path}/d/*.parquet", spec) == expected
    assert list_files(f"{url}/a.parquet", spec) == expected[:1]


# --- an fsspec filesystem (memory://, a real fsspec implementation) ---------------------------


@pytest.fixture
def memory_root() -> Iterator[str]:
    """A fresh directory on fsspec's process-global memory filesystem, removed afterwards."""
    root = f"/tdu-test-{uuid.uuid4().hex}"
    yield root
    fs = fsspec.filesystem("memory")
    if fs.exists(root):
        fs.rm(root, recursive=True)


def test_memory_filesystem_listing(memory_root: str) -> None:
    mem = fsspec.filesystem("memory")
    contents = {
        "b/2.parquet": b"22",
        "a.parquet": b"1",
        "b/1.parquet": b"333",
        "_SUCCESS": b"",
        ".x": b"x",
        "_temporary/t.parquet": b"t",
    }
    for rel, data in contents.items():
        mem.pipe(f"{memory_root}/{rel}", data)
    spec = FileSystemSpec("memory", {"marker": "kept"})
    files = list_files(f"memory://{memory_root}", spec)
    assert paths(files, memory_root) == ["a.parquet", "b/1.parquet", "b/2.parquet"]
    assert [f.size for f in files] == [1, 3, 2]
    globbed = list_files(f"memory://{memory_root}/b/*.parquet", spec)
    assert paths(globbed, memory_root) == ["b/1.parquet", "b/2.parquet"]
    braced = list_files(f"memory://{memory_root}/{{b/2,a}}.parquet", spec)
    assert paths(braced, memory_root) == ["b/2.parquet", "a.parquet"]
    # Storage options reach the fsspec filesystem the spec builds.
    assert spec.fsspec().storage_options == {"marker": "kept"}
    assert spec.url(files[0].path) == f"memory://{memory_root}/a.parquet"
    with pytest.raises(StorageNotFoundError) as info:
        list_files(f"memory://{memory_root}/missing.parquet", spec)
    assert f"memory://{memory_root}/missing.parquet" in str(info.value)


def test_storage_options_change_what_is_listed(memory_root: str) -> None:
    # fsspec's "dir" filesystem roots every path at its ``path`` option: the same source lists
    # different files under different options, so the options are really used.
    mem = fsspec.filesystem("memory")
    mem.pipe(f"{memory_root}/one/sub/a.parquet", b"a")
    mem.pipe(f"{memory_root}/two/sub/b.parquet", b"bb")
    mem.pipe(f"{memory_root}/two/sub/c.parquet", b"ccc")
    for root, expected in [("one", ["sub/a.parquet"]), ("two", ["sub/b.parquet", "sub/c.parquet"])]:
        spec = FileSystemSpec("dir", {"path": f"{memory_root}/{root}", "target_protocol": "memory"})
        files = list_files("dir://sub", spec)
        assert [f.path for f in files] == expected
        assert all(spec.fsspec().cat_file(f.path) for f in files)


@pytest.mark.parametrize(
    "source", ["pipe:curl -s http://example.com/shard-000.tar", "pipe:cat shards/a.tar"]
)
def test_a_shell_pipe_source_is_refused_before_anything_runs(tmp_path: Path, source: str) -> None:
    marker = tmp_path / "ran"
    with pytest.raises(InvalidSourceError, match="pipe: sources are not supported"):
        tdu.create_dataloader(f"{source}; touch {marker}", num_workers=0)
    assert not marker.exists()


def test_a_slow_listing_logs_its_progress_and_total(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    from torch_dataloader_utils.fs import listing, progress

    touch(tmp_path, "a/x", "b/y", "b/z")
    monkeypatch.setattr(progress, "LOG_EVERY", 0.0)  # every step counts as slow
    monkeypatch.setattr(listing, "LOG_EVERY", 0.0)
    with caplog.at_level(logging.INFO, logger="torch_dataloader_utils.planning"):
        list_files(str(tmp_path / "{a,b}"), LOCAL)
    lines = [r.getMessage() for r in caplog.records]
    assert lines[0].startswith("planning: 1 of 2 paths listed (50%)")
    assert lines[-1].startswith("planning: listed 3 files in ")
