"""DALI's index format (exact bytes), its parser's checks, and `load_index`'s sibling and
cache."""

from __future__ import annotations

import io
import os
import tarfile
from collections.abc import Sequence
from pathlib import Path

import pytest

from torch_dataloader_utils.errors import CorruptFileError, InvalidArgumentError
from torch_dataloader_utils.fs.spec import FileSystemSpec
from torch_dataloader_utils.webdataset import (
    ShardIndex,
    build_index,
    format_index,
    index_path,
    load_index,
    parse_index,
)

pytestmark = pytest.mark.timeout(60)


def make_tar(members: Sequence[tuple[str, bytes]]) -> bytes:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.GNU_FORMAT) as tf:
        for name, value in members:
            info = tarfile.TarInfo(name)
            info.size = len(value)
            tf.addfile(info, io.BytesIO(value))
    return out.getvalue()


def index_of(data: bytes, *, lowercase: bool = True) -> ShardIndex:
    return build_index(
        lambda o, n: data[o : o + n], len(data), where="mem://s.tar", lowercase=lowercase
    )


SMALL = [
    ("s0.jpg", b"abc"),
    ("s0.cls", b"7"),
    ("dir/s1.JPG", b"x" * 600),
    ("dir/s1.seg.png", b""),
]
# Hand-computed from DALI's tools/wds2idx.py: first line f"v1.2 {len(samples)}\n"; each sample
# one line, its components joined by " ", each component " ".join(map(str, (ext, offset, size,
# name))) with ext = name after the first dot of the file name, raw case; offset = the data
# offset (header + 512). Members: s0.jpg header 0 / data 512 (3 B, padded to 512); s0.cls
# header 1024 / data 1536; dir/s1.JPG header 2048 / data 2560 (600 B, padded to 1024);
# dir/s1.seg.png header 3584 / data 4096 (0 B). Every line ends with "\n".
SMALL_INDEX = (
    "v1.2 2\n"
    "jpg 512 3 s0.jpg cls 1536 1 s0.cls\n"
    "JPG 2560 600 dir/s1.JPG seg.png 4096 0 dir/s1.seg.png\n"
)


def test_window_is_the_earlier_name_of_read_bytes() -> None:
    data = make_tar(SMALL)

    def build(**kw: int) -> ShardIndex:
        return build_index(lambda o, n: data[o : o + n], len(data), where="mem://s.tar", **kw)

    with pytest.warns(DeprecationWarning, match="window= is deprecated.*use read_bytes="):
        assert build(window=512) == build(read_bytes=512) == index_of(data)
    with pytest.raises(InvalidArgumentError, match="give read_bytes= alone"):
        build(window=512, read_bytes=512)


def test_format_index_is_byte_identical_to_dalis_tool() -> None:
    data = make_tar(SMALL)
    assert format_index(index_of(data)) == SMALL_INDEX
    assert format_index(index_of(data, lowercase=False)) == SMALL_INDEX
    for sample, (name, body) in zip(
        [c for s in index_of(data).samples for c in s.components], SMALL, strict=True
    ):
        assert sample.name == name and data[sample.offset : sample.end] == body


def test_parse_round_trips_and_lowercases() -> None:
    index = parse_index(SMALL_INDEX, where="x.idx")
    assert index == index_of(make_tar(SMALL))
    assert [s.key for s in index.samples] == ["s0", "dir/s1"]
    assert index.extensions() == ["jpg", "cls", "seg.png"]
    assert (index.data_start(1), index.data_end(1)) == (2560, 4096)
    raw = parse_index(SMALL_INDEX, where="x.idx", lowercase=False)
    assert raw.samples[1].components[0].ext == "JPG"
    assert format_index(raw) == SMALL_INDEX


def test_parse_v11_has_no_names() -> None:
    text = "v1.1 2\njpg 512 3 cls 1536 1\nJPG 2560 600 seg.png 4096 0\n"
    index = parse_index(text, where="x.idx")
    assert index.version == "v1.1"
    assert [[(c.ext, c.offset, c.size) for c in s.components] for s in index.samples] == [
        [("jpg", 512, 3), ("cls", 1536, 1)],
        [("jpg", 2560, 600), ("seg.png", 4096, 0)],
    ]
    with pytest.raises(InvalidArgumentError, match="no member names"):
        format_index(index)


@pytest.mark.parametrize(
    ("text", "match"),
    [
        ("v2.0 1\njpg 512 3 a.jpg\n", r"line 1: expected 'v1\.2"),
        ("", r"line 1: expected"),
        ("v1.2 x\n", r"line 1: sample count 'x'"),
        (
            "v1.2 3\njpg 512 3 a.jpg\n",
            r"line 3: the header line declares 3 samples, the file has 1 ",
        ),
        ("v1.2 1\njpg 512 3 a.jpg\ncls 1536 1 b.cls\n", r"line 3: the header line declares 1"),
        ("v1.2 1\njpg 512 3\n", r"line 2: expected groups of 4 fields"),
        ("v1.2 2\njpg 512 3 a.jpg\n\ncls 1536 1 b.cls\n", r"line 3: expected groups"),
        ("v1.2 1\njpg 500 3 a.jpg\n", r"line 2: offset 500 .* not a multiple of 512"),
        ("v1.2 1\njpg 512 -3 a.jpg\n", r"line 2: offset '512' / size '-3'"),
        ("v1.2 1\npng 512 3 a.jpg\n", r"line 2: extension 'png' does not match name 'a\.jpg'"),
        ("v1.2 1\njpg 512 3 a.jpg cls 1536 1 b.cls\n", r"line 2: names 'b\.cls' .* different"),
        ("v1.2 1\njpg 512 3 a.jpg JPG 1536 1 a.JPG\n", r"line 2: extension 'jpg' appears twice"),
    ],
)
def test_parse_errors_name_the_file_and_line(text: str, match: str) -> None:
    with pytest.raises(CorruptFileError, match=r"^idx/s\.idx: " + match):
        parse_index(text, where="idx/s.idx")


TRICKY = [
    ("a.b/c.d/s0.JPG", b"1"),
    ("a.b/c.d/s0.seg.PNG", b"22"),
    ("s1.tar.gz", b""),
    ("s1.jpg", b"333"),
    ("x/y/s2.cls", b"9" * 700),
    ("x/y/s2.Seg.png", b"8"),
]


@pytest.mark.parametrize("lowercase", [True, False])
def test_bulk_parsing_equals_line_by_line(lowercase: bool) -> None:
    # parse_index parses v1.2 in bulk (arrays) and line by line only where the bulk parser
    # refuses a line: both must give the samples a scan gives, whatever the names.
    members = TRICKY
    scanned = index_of(make_tar(members), lowercase=lowercase)
    text = format_index(scanned)
    parsed = parse_index(text, where="x.idx", lowercase=lowercase)
    assert parsed == scanned and parsed.samples == scanned.samples
    assert parsed.extensions() == scanned.extensions()
    assert format_index(parsed) == text
    arrays, again = parsed.arrays(), scanned.arrays()
    assert arrays.keys == again.keys and arrays.names == again.names
    assert arrays.extensions == again.extensions
    for name in ("counts", "ext", "offsets", "sizes"):
        assert getattr(arrays, name).tolist() == getattr(again, name).tolist(), name
    # Offsets in digits int() reads but the bulk parser does not (Arabic-Indic): the same
    # index, line by line.
    arabic = text.replace(" 512 ", " \u0665\u0661\u0662 ", 1)
    assert arabic != text and parse_index(arabic, where="x.idx", lowercase=lowercase) == scanned


def test_check_against_the_shard() -> None:
    index = parse_index(SMALL_INDEX, where="x.idx")
    index.check(len(make_tar(SMALL)), where="x.idx")
    index.check(4096, where="x.idx")  # the last (empty) component ends at 4096
    with pytest.raises(CorruptFileError, match=r"x\.idx: line 3: 'jpg' at offset 2560 .* past"):
        index.check(3000, where="x.idx")
    swapped = "v1.2 2\njpg 2560 3 s0.jpg\ncls 512 1 s1.cls\n"
    with pytest.raises(CorruptFileError, match=r"line 3: offset 512 .* overlaps"):
        parse_index(swapped, where="x.idx").check(10_000, where="x.idx")
    with pytest.raises(CorruptFileError, match=r"line 2: offset 0 .* overlaps"):
        parse_index("v1.2 1\njpg 0 3 a.jpg\n", where="x.idx").check(10_000, where="x.idx")


def test_empty_shard_index() -> None:
    for data in (b"", bytes(1024), make_tar([])):
        index = index_of(data)
        assert len(index) == 0 and format_index(index) == "v1.2 0\n"
    assert len(parse_index("v1.2 0\n", where="x")) == 0


def test_names_with_whitespace_cannot_be_written() -> None:
    index = index_of(make_tar([("a b.jpg", b"1")]))
    assert index.samples[0].key == "a b"
    with pytest.raises(InvalidArgumentError, match="whitespace"):
        format_index(index)


def test_index_path() -> None:
    assert index_path("x/a.tar") == "x/a.idx"
    assert index_path("bucket/train-000001.tar") == "bucket/train-000001.idx"
    assert index_path("x/a.shard") == "x/a.shard.idx"


# --- load_index ------------------------------------------------------------------------------


class CountingFS(FileSystemSpec):
    """The local filesystem, counting shard range reads (to prove what was read)."""

    def __init__(self) -> None:
        super().__init__("file")
        self.reads = 0

    def read_range(self, path: str, offset: int, size: int) -> bytes:
        self.reads += 1
        return super().read_range(path, offset, size)


@pytest.fixture
def shard(tmp_path: Path) -> Path:
    path = tmp_path / "data" / "shard-000.tar"
    path.parent.mkdir()
    path.write_bytes(make_tar(SMALL))
    return path


def load(shard: Path, fs: FileSystemSpec, cache: Path | str, **kw: object) -> ShardIndex:
    return load_index(
        str(shard),
        fs,
        size=shard.stat().st_size,
        cache_dir=str(cache),
        **kw,  # type: ignore[arg-type]
    )


def test_load_builds_once_then_reads_the_cache(shard: Path, tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    fs = CountingFS()
    first = load(shard, fs, cache)
    assert fs.reads > 0
    [entry] = list(cache.iterdir())
    assert entry.read_text() == SMALL_INDEX
    written = entry.stat().st_mtime_ns
    fs.reads = 0
    assert load(shard, fs, cache) == first
    assert fs.reads == 0  # the shard was not read again
    assert entry.stat().st_mtime_ns == written
    assert sorted(p.name for p in shard.parent.iterdir()) == ["shard-000.tar"]  # nothing beside
    # lowercase=False groups differently: its own entry
    assert load(shard, fs, cache, lowercase=False).samples[1].components[0].ext == "JPG"
    assert len(list(cache.iterdir())) == 2


def test_a_changed_shard_is_rebuilt(shard: Path, tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    fs = CountingFS()
    load(shard, fs, cache)
    shard.write_bytes(make_tar([("new.txt", b"same size? no")]))
    fs.reads = 0
    assert [s.key for s in load(shard, fs, cache).samples] == ["new"]
    assert fs.reads > 0
    # Same size, new mtime: rebuilt too.
    shard.write_bytes(make_tar([("old.txt", b"same size? no")]))
    os.utime(shard, ns=(1, 1))
    assert [s.key for s in load(shard, fs, cache).samples] == ["old"]


def test_a_corrupt_cache_entry_is_rebuilt(shard: Path, tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    fs = CountingFS()
    expected = load(shard, fs, cache)
    [entry] = list(cache.iterdir())
    for garbage in ("v1.2 5\njpg 512 3 s0.jpg\n", "v1.2 1\njpg 1048576 3 s0.jpg\n", "\0\0"):
        entry.write_text(garbage)
        fs.reads = 0
        assert load(shard, fs, cache) == expected
        assert fs.reads > 0
        assert entry.read_text() == SMALL_INDEX


def test_a_sibling_index_is_preferred(shard: Path, tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    fs = CountingFS()
    sibling = shard.with_suffix(".idx")
    sibling.write_text(SMALL_INDEX)
    assert load(shard, fs, cache) == parse_index(SMALL_INDEX, where="x")
    assert fs.reads == 0 and not cache.exists()
    sibling.write_text("v1.2 1\njpg 512 99999 s0.jpg\n")  # an index of another shard
    where = rf"{sibling} \(the index of {shard}\)"
    with pytest.raises(CorruptFileError, match=rf"{where}: line 2: .* past the end"):
        load(shard, fs, cache)
    sibling.write_text("v1.1 2\njpg 512 3 cls 1536 1\nJPG 2560 600 seg.png 4096 0\n")
    assert [s.key for s in load(shard, fs, cache).samples] == ["s0", "dir/s1"]  # scanned
    assert fs.reads > 0


@pytest.mark.filterwarnings("ignore:.*cannot be cached:UserWarning")  # (said once a process)
def test_an_unwritable_cache_dir_still_works(shard: Path, tmp_path: Path) -> None:
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("a file where the cache directory should be")
    fs = CountingFS()
    assert len(load(shard, fs, blocker / "cache")) == 2
    readonly = tmp_path / "ro"
    readonly.mkdir()
    readonly.chmod(0o500)
    try:
        assert len(load(shard, fs, readonly)) == 2
    finally:
        readonly.chmod(0o700)


def test_no_cache_when_disabled(
    shard: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    fs = CountingFS()
    load(shard, fs, "")
    assert not (tmp_path / "xdg").exists()
    load_index(str(shard), fs, size=shard.stat().st_size)  # the default cache directory
    assert len(list((tmp_path / "xdg" / "torch_dataloader_utils" / "wds-index").iterdir())) == 1


def test_a_corrupt_shard_names_the_shard_and_offset(shard: Path, tmp_path: Path) -> None:
    data = shard.read_bytes()
    shard.write_bytes(data[: 2048 + 100])
    with pytest.raises(CorruptFileError, match=rf"^{shard}: offset 2048: truncated header"):
        load(shard, CountingFS(), tmp_path / "cache")
