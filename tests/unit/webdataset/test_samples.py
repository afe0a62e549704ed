"""Sample grouping against webdataset 1.0.2's own `group_by_keys`, and our documented
differences from it."""

from __future__ import annotations

import io
import tarfile
from collections.abc import Sequence

import pytest
from webdataset.tariterators import base_plus_ext, group_by_keys, tar_file_iterator

from torch_dataloader_utils.errors import CorruptFileError, TorchDataloaderUtilsWarning
from torch_dataloader_utils.webdataset import (
    Sample,
    TarMember,
    group_samples,
    scan_tar,
    split_name,
)

pytestmark = pytest.mark.timeout(60)
WHERE = "file:///data/shard-000.tar"


def make_tar(members: Sequence[tuple[str, bytes | str]]) -> bytes:
    """A tar of regular files; a str value makes a member of that other kind."""
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as tf:
        for name, value in members:
            info = tarfile.TarInfo(name)
            if isinstance(value, str):
                info.type = {"dir": tarfile.DIRTYPE, "symlink": tarfile.SYMTYPE}[value]
                info.linkname = "x.txt" if value == "symlink" else ""
                tf.addfile(info)
            else:
                info.size = len(value)
                tf.addfile(info, io.BytesIO(value))
    return out.getvalue()


def members(data: bytes) -> list[TarMember]:
    """The members of ``data`` as an index scans a shard (`build_index`)."""
    return list(scan_tar(lambda offset, n: data[offset : offset + n], len(data), where=WHERE))


def ours(data: bytes, *, lowercase: bool = True) -> list[dict[str, object]]:
    """Our samples as webdataset-style dicts: ``__key__`` plus extension -> bytes."""
    found = []
    samples = group_samples(members(data), where=WHERE, lowercase=lowercase)
    for sample in samples:
        entry: dict[str, object] = {"__key__": sample.key}
        for c in sample.components:
            entry[c.ext] = data[c.offset : c.end]
        found.append(entry)
    return found


def theirs(data: bytes) -> list[dict[str, object]]:
    """webdataset's grouping of the same bytes."""
    files = ({**f, "__url__": WHERE} for f in tar_file_iterator(io.BytesIO(data)))
    return [{k: v for k, v in s.items() if k != "__url__"} for s in group_by_keys(files)]


NAMES = [
    "a.jpg",
    "a/b.c/d.seg.JPG",
    "dir.x/y.tar.gz",
    "k",
    "x.",
    "UPPER/Key.TXT",
    "a..b",
    "ü/ñ.json",
]


@pytest.mark.parametrize("name", NAMES)
def test_split_name_matches_webdataset(name: str) -> None:
    key, ext = split_name(name, lowercase=False)
    expected = base_plus_ext(name)
    if expected == (None, None):
        assert ext == "" and key == name  # no dot: webdataset drops the member, we raise
    else:
        assert (key, ext) == expected
    assert split_name(name) == (key, ext.lower())


def test_grouping_matches_webdataset() -> None:
    members = [
        ("s0.jpg", b"img0"),
        ("s0.cls", b"0"),
        ("s0.seg.png", b"seg0"),
        ("d/", "dir"),
        ("d/s1.JPG", b"img1"),
        ("d/s1.Json", b"{}"),
        ("d.e/s2.txt", b""),
        ("s3.txt", b"x" * 1000),
        ("__meta__", b"skipped by both"),
        ("s4.bin", b"\0" * 512),
    ]
    data = make_tar(members)
    expected = theirs(data)
    assert [s["__key__"] for s in expected] == ["s0", "d/s1", "d.e/s2", "s3", "s4"]
    assert ours(data) == expected
    assert ours(data)[1].keys() == {"__key__", "jpg", "json"}  # lower-cased
    assert ours(data, lowercase=False)[1].keys() == {"__key__", "JPG", "Json"}


def test_non_adjacent_equal_keys_make_two_samples_with_a_warning() -> None:
    data = make_tar([("a.jpg", b"1"), ("b.jpg", b"2"), ("a.cls", b"3")])
    with pytest.warns(TorchDataloaderUtilsWarning) as warned:
        got = ours(data)
    assert got == theirs(data)
    assert [s["__key__"] for s in got] == ["a", "b", "a"]
    (warning,) = [str(w.message) for w in warned]
    assert "key 'a' appears again" in warning and WHERE in warning


def test_repeated_extension_is_an_error_in_both() -> None:
    data = make_tar([("a.jpg", b"1"), ("a.JPG", b"2")])
    with pytest.raises(ValueError, match="duplicate"):
        theirs(data)
    with pytest.raises(CorruptFileError, match=rf"{WHERE}: offset 1024: sample 'a' has "):
        ours(data)
    assert [len(s.components) for s in _samples(data, lowercase=False)] == [2]


def test_dotfiles_are_skipped_as_dali_does() -> None:
    data = make_tar([("a.jpg", b"1"), ("a/.hidden.txt", b"h"), (".top", b"t"), ("b.jpg", b"2")])
    assert [s["__key__"] for s in ours(data)] == ["a", "b"]
    # webdataset's quirk: the dotfile becomes a sample keyed "a/" (its documented difference).
    assert [s["__key__"] for s in theirs(data)] == ["a", "a/", "b"]


def test_a_member_without_extension_is_an_error() -> None:
    data = make_tar([("a.jpg", b"1"), ("README", b"r")])
    assert [s["__key__"] for s in theirs(data)] == ["a"]  # webdataset drops it silently
    with pytest.raises(CorruptFileError, match=r"offset 1024: member 'README' has no extension"):
        ours(data)
    with pytest.raises(CorruptFileError, match="no extension"):
        ours(make_tar([("x.", b"1")]))


def test_links_are_an_error() -> None:
    data = make_tar([("a.jpg", b"1"), ("a.txt", "symlink")])
    with pytest.raises(CorruptFileError, match=r"offset 1024: member 'a\.txt' is a symlink"):
        ours(data)


def test_empty_shards_have_no_samples() -> None:
    assert ours(b"") == [] == ours(make_tar([]))
    assert ours(make_tar([("d/", "dir")])) == []


def test_sample_helpers() -> None:
    [sample] = _samples(make_tar([("k.a", b"12"), ("k.b", b"345")]))
    assert (sample.start, sample.end) == (512, 1024 + 512 + 3)
    assert sample.get("b") is not None and sample.get("b").size == 3  # type: ignore[union-attr]
    assert sample.get("c") is None


def _samples(data: bytes, *, lowercase: bool = True) -> list[Sample]:
    return list(group_samples(members(data), where=WHERE, lowercase=lowercase))
