"""The tar header parser against Python's `tarfile`, member by member, on every tar dialect
tarfile writes, and on truncated and corrupt archives."""

from __future__ import annotations

import io
import os
import random
import tarfile
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import pytest

from torch_dataloader_utils.errors import CorruptFileError
from torch_dataloader_utils.webdataset import TarMember, scan_tar
from torch_dataloader_utils.webdataset.tar import padded

pytestmark = pytest.mark.timeout(120)

FORMATS = {
    "ustar": tarfile.USTAR_FORMAT,
    "gnu": tarfile.GNU_FORMAT,
    "pax": tarfile.PAX_FORMAT,
}
WHERE = "mem://shard.tar"

# (name, kind, size) with kind one of file/dir/symlink/hardlink
Spec = tuple[str, str, int]


def make_tar(
    specs: Sequence[Spec],
    *,
    format: int = tarfile.PAX_FORMAT,
    pax_headers: dict[str, str] | None = None,
    seed: int = 0,
) -> bytes:
    """A tar written by `tarfile` holding ``specs``; file data is seeded random bytes."""
    rng = random.Random(seed)
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=format, pax_headers=pax_headers) as tf:
        for name, kind, size in specs:
            info = tarfile.TarInfo(name)
            info.mtime = 1_700_000_000
            if kind == "file":
                info.size = size
                tf.addfile(info, io.BytesIO(rng.randbytes(size)))
                continue
            info.type = {
                "dir": tarfile.DIRTYPE,
                "symlink": tarfile.SYMTYPE,
                "hardlink": tarfile.LNKTYPE,
                "fifo": tarfile.FIFOTYPE,
            }[kind]
            info.linkname = "target.txt" if kind in ("symlink", "hardlink") else ""
            tf.addfile(info)
    return out.getvalue()


def tarfile_members(data: bytes) -> list[TarMember]:
    """What `tarfile` says: the reference."""
    found = []
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:") as tf:
        for m in tf:
            if m.type == tarfile.GNUTYPE_SPARSE:
                kind = "other"
            elif m.isreg():
                kind = "file"
            elif m.isdir():
                kind = "dir"
            elif m.issym():
                kind = "symlink"
            elif m.islnk():
                kind = "hardlink"
            else:
                kind = "other"
            found.append(TarMember(m.name, m.offset, m.offset_data, m.size, kind))
    return found


def reader(data: bytes, log: list[tuple[int, int]] | None = None) -> Callable[[int, int], bytes]:
    def read(offset: int, n: int) -> bytes:
        if log is not None:
            log.append((offset, n))
        return data[offset : offset + n]

    return read


def scan(data: bytes, read_bytes: int = 8 << 20) -> list[TarMember]:
    return list(scan_tar(reader(data), len(data), where=WHERE, read_bytes=read_bytes))


LONG_DIR = "d" * 90 + "/" + "e" * 60  # > 100 chars: ustar splits it into prefix + name
SPECS: list[Spec] = [
    ("a/", "dir", 0),
    ("a/000.jpg", "file", 1000),
    ("a/000.cls", "file", 1),
    ("a/000.empty", "file", 0),
    ("a/001.block", "file", 512),
    ("a/001.two", "file", 1024),
    (LONG_DIR + "/002.txt", "file", 700),
    ("ünïcödé/003.txt", "file", 5),
    ("a/link.txt", "symlink", 0),
    ("a/hard.txt", "hardlink", 0),
    ("a/fifo", "fifo", 0),
]
# GNU and PAX can store a single component longer than 100 bytes; ustar cannot.
LONG_SPECS: list[Spec] = [("x" * 150 + ".jpg", "file", 33), ("y" * 120 + "/z.cls", "file", 2)]


@pytest.mark.parametrize("fmt", sorted(FORMATS))
def test_members_match_tarfile_in_every_format(fmt: str) -> None:
    specs = SPECS + (LONG_SPECS if fmt != "ustar" else [])
    data = make_tar(specs, format=FORMATS[fmt])
    expected = tarfile_members(data)
    assert len(expected) == len(specs)
    assert scan(data) == expected
    # The kinds themselves, independent of the helper that maps tarfile's.
    assert [m.kind for m in expected][:3] == ["dir", "file", "file"]
    assert {m.kind for m in expected} == {"dir", "file", "symlink", "hardlink", "other"}


def test_long_names_use_the_dialects_extension_headers() -> None:
    for fmt, marker in ((tarfile.GNU_FORMAT, b"././@LongLink"), (tarfile.PAX_FORMAT, b"path=")):
        data = make_tar(LONG_SPECS, format=fmt)
        assert marker in data  # the test covers the GNU ``L`` and PAX ``x`` paths
        members = scan(data)
        assert [m.name for m in members] == [s[0] for s in LONG_SPECS]
        assert members[0].header_offset == 0 and members[0].offset > 512  # header chain
    ustar = make_tar([(LONG_DIR + "/002.txt", "file", 3)], format=tarfile.USTAR_FORMAT)
    assert ustar[345:350] == b"ddddd"  # the prefix field is used
    assert scan(ustar)[0].name == LONG_DIR + "/002.txt"


def test_pax_global_header_is_not_a_member() -> None:
    data = make_tar(SPECS[:3], format=tarfile.PAX_FORMAT, pax_headers={"comment": "hello"})
    assert data[156:157] == b"g"
    assert scan(data) == tarfile_members(data)
    assert scan(data)[0].header_offset == 1024  # after the global header and its data block


def test_pax_size_overrides_the_header_size() -> None:
    # A member whose header size field is 0 and whose real size is in a PAX record.
    body = b"q" * 700
    records = _pax_record("size", "700") + _pax_record("path", "p/long.bin")
    data = (
        _header("././@PaxHeader", len(records), b"x")
        + _pad(records)
        + _header("p/short.bin", 0, b"0")
        + _pad(body)
        + bytes(1024)
    )
    assert scan(data) == tarfile_members(data)
    [member] = scan(data)
    assert (member.name, member.header_offset, member.offset, member.size) == (
        "p/long.bin",
        0,
        1536,  # PAX header, its records, the member's own header
        700,
    )
    assert data[member.offset : member.end] == body


def test_base256_size_matches_tarfile() -> None:
    data = bytearray(make_tar(SPECS[1:3], format=tarfile.GNU_FORMAT))
    # Rewrite the first member's octal size (1000) in GNU base-256, then fix the checksum.
    data[124:136] = b"\x80" + (1000).to_bytes(11, "big")
    _fix_checksum(data, 0)
    assert data[124] == 0x80
    assert scan(bytes(data)) == tarfile_members(bytes(data))
    assert scan(bytes(data))[0].size == 1000


def test_a_member_over_8_gib_is_skipped_without_reading_it(tmp_path: Path) -> None:
    # 9 GiB does not fit 11 octal digits: tarfile's GNU format writes it in base-256. The file
    # is sparse on disk, so this costs no space.
    big = 9 << 30
    info = tarfile.TarInfo("big.bin")
    info.size = big
    header = info.tobuf(format=tarfile.GNU_FORMAT)
    assert header[124] == 0x80
    tail = make_tar([("after.txt", "file", 10)], format=tarfile.GNU_FORMAT)
    path = tmp_path / "big.tar"
    with open(path, "wb") as f:
        f.write(header)
        f.seek(512 + big)
        f.write(tail)
    size = path.stat().st_size
    log: list[tuple[int, int]] = []
    fd = os.open(path, os.O_RDONLY)
    try:

        def read(offset: int, n: int) -> bytes:
            log.append((offset, n))
            return os.pread(fd, n, offset)

        members = list(scan_tar(read, size, where=str(path), read_bytes=1 << 16))
    finally:
        os.close(fd)
    with tarfile.open(path) as tf:
        expected = [(m.name, m.offset, m.offset_data, m.size) for m in tf]
    assert [(m.name, m.header_offset, m.offset, m.size) for m in members] == expected
    assert members[0].size == big
    assert sum(n for _, n in log) < 1 << 20  # the headers, not the 9 GiB


@pytest.mark.parametrize("read_bytes", [512, 1000, 4096, 1 << 20])
def test_any_bytes_read_at_a_time_give_the_same_members(read_bytes: int) -> None:
    data = make_tar(SPECS + LONG_SPECS, format=tarfile.PAX_FORMAT)
    assert scan(data, read_bytes=read_bytes) == tarfile_members(data)


def test_large_data_is_skipped_without_being_read() -> None:
    data = make_tar([("a.bin", "file", 1 << 20), ("a.txt", "file", 3)])
    log: list[tuple[int, int]] = []
    members = list(scan_tar(reader(data, log), len(data), where=WHERE, read_bytes=8192))
    assert [m.name for m in members] == ["a.bin", "a.txt"]
    assert sum(n for _, n in log) < 64 << 10


def test_seeded_random_archives_match_tarfile() -> None:
    rng = random.Random(1234)
    compared = 0
    for trial in range(40):
        fmt = rng.choice(list(FORMATS.values()))
        specs: list[Spec] = []
        for i in range(rng.randint(0, 12)):
            kind = rng.choice(["file"] * 6 + ["dir", "symlink", "hardlink"])
            depth = rng.randint(0, 3)
            name = "/".join(_name(rng, fmt) for _ in range(depth)) + f"/{i}.{_name(rng, fmt)}"
            size = rng.choice([0, 1, 511, 512, 513, 1024, rng.randint(0, 5000)])
            specs.append((name.lstrip("/"), kind, size if kind == "file" else 0))
        try:
            data = make_tar(specs, format=fmt, seed=trial)
        except ValueError:  # ustar cannot hold some long names: tarfile refuses
            continue
        assert scan(data, read_bytes=rng.choice([512, 2048, 1 << 20])) == tarfile_members(data)
        compared += 1
    assert compared >= 25


# --- truncated and corrupt archives -------------------------------------------------------


def cut_points(data: bytes, members: Sequence[TarMember]) -> Iterator[int]:
    """Offsets around every boundary: inside headers, data, padding, the end marker."""
    points = {0, len(data)}
    for m in members:
        for base in (m.header_offset, m.offset, m.end, padded(m.end)):
            points.update(base + d for d in (-1, 0, 1, 100, 511, 512, 513))
    points.update(range(0, len(data), 97))
    return iter(sorted(p for p in points if 0 <= p <= len(data)))


@pytest.mark.parametrize("fmt", sorted(FORMATS))
def test_cut_archives_raise_unless_only_the_end_marker_is_cut(fmt: str) -> None:
    specs = SPECS[:8] + (LONG_SPECS if fmt != "ustar" else [])
    data = make_tar(specs, format=FORMATS[fmt])
    full = scan(data)
    boundaries = {padded(m.end) for m in full}
    end_of_members = max(boundaries)
    clean = raised = at_boundary = 0
    for cut in cut_points(data, full):
        piece = data[:cut]
        if cut == 0 or cut > end_of_members:
            # Nothing, or every member and a (partial) end marker: a clean end, with exactly
            # the members tarfile reads (tarfile calls a 0-byte file an error).
            got = scan(piece)
            assert got == [m for m in full if padded(m.end) <= cut]
            if cut:
                assert got == tarfile_members(piece)
            clean += 1
        elif cut in boundaries:
            # Cut between members: tarfile reads the members before the cut without a word;
            # the samples after it would vanish.
            assert tarfile_members(piece) == [m for m in full if padded(m.end) <= cut]
            with pytest.raises(CorruptFileError, match=rf"offset {cut}: .*without the end-of"):
                scan(piece)
            at_boundary += 1
        else:
            with pytest.raises(CorruptFileError, match=r"mem://shard\.tar: offset \d+: "):
                scan(piece)
            raised += 1
    assert clean > 2 and at_boundary >= len(full) - 1 and raised > 5 * len(full)


def test_truncated_error_names_the_offset_of_the_cut_member() -> None:
    data = make_tar([("a.txt", "file", 100), ("b.bin", "file", 2000)])
    with pytest.raises(CorruptFileError, match=r"offset 1024: member 'b\.bin'.*run past"):
        scan(data[: 1536 + 1000])
    with pytest.raises(CorruptFileError, match=r"offset 1024: truncated header: 300 bytes"):
        scan(data[: 1024 + 300])


@pytest.mark.parametrize("seed", range(3))
def test_garbage_raises_at_offset_zero(seed: int) -> None:
    data = random.Random(seed).randbytes(4096)
    with pytest.raises(CorruptFileError, match=r"offset 0: "):
        scan(data)


def test_a_flipped_header_byte_is_a_checksum_error_at_that_header() -> None:
    data = make_tar([("a.txt", "file", 100), ("b.txt", "file", 100), ("c.txt", "file", 1)])
    for at in (1024, 1024 + 3, 1024 + 124 + 5, 1024 + 300):  # name, size field, magic area
        bad = bytearray(data)
        bad[at] ^= 0x01
        with pytest.raises(CorruptFileError, match=r"offset 1024: bad header checksum"):
            scan(bytes(bad))
    bad = bytearray(data)
    bad[1024 + 150] ^= 0x01  # the stored checksum itself
    with pytest.raises(CorruptFileError, match=r"offset 1024: "):
        scan(bytes(bad))


def test_non_ascii_headers_use_the_exact_checksum() -> None:
    # High bytes make the fast (ASCII-only) path inapplicable; both sums are checked exactly.
    data = make_tar([("ü" * 40 + ".txt", "file", 3)], format=tarfile.USTAR_FORMAT)
    assert not data[:512].isascii()
    assert scan(data) == tarfile_members(data)
    bad = bytearray(data)
    bad[5] ^= 0x01
    with pytest.raises(CorruptFileError, match="bad header checksum"):
        scan(bytes(bad))


def test_malformed_size_field_is_an_error() -> None:
    data = bytearray(make_tar([("a.txt", "file", 10)]))
    data[124:136] = b"00000000z12\0"
    _fix_checksum(data, 0)
    with pytest.raises(CorruptFileError, match=r"offset 0: malformed size field"):
        scan(bytes(data))


def test_malformed_pax_record_is_an_error() -> None:
    records = b"30 path=too-short\n"  # the length says 30, the record is 18 bytes
    data = _header("././@PaxHeader", len(records), b"x") + _pad(records)
    data += _header("a.txt", 1, b"0") + _pad(b"a") + bytes(1024)
    with pytest.raises(CorruptFileError, match=r"offset 512: malformed PAX record"):
        scan(data)


def test_empty_archives_have_no_members() -> None:
    assert scan(b"") == []
    assert scan(bytes(1024)) == []
    assert scan(bytes(10240)) == []
    assert scan(make_tar([])) == [] == tarfile_members(make_tar([]))


def test_data_after_the_end_marker_is_an_error() -> None:
    one = make_tar([("a.txt", "file", 3)])
    two = make_tar([("b.txt", "file", 3)])
    with pytest.raises(CorruptFileError, match=r"offset 1024: non-zero bytes after the end"):
        scan(one + two)  # concatenated: tarfile would silently stop after a.txt
    lone = one[:1024] + bytes(512) + two  # a lone zero block mid-archive
    with pytest.raises(CorruptFileError, match="lone zero block"):
        scan(lone)


def test_extension_header_without_a_member_is_an_error() -> None:
    records = _pax_record("path", "x.txt")
    data = _header("././@PaxHeader", len(records), b"x") + _pad(records)
    with pytest.raises(CorruptFileError, match=r"offset 0: extension header not followed"):
        scan(data)
    with pytest.raises(CorruptFileError, match=r"offset 0: extension header followed by the end"):
        scan(data + bytes(1024))


def test_read_returning_too_few_bytes_is_an_error() -> None:
    data = make_tar([("a.txt", "file", 3)])
    with pytest.raises(CorruptFileError, match="shorter than its listed size"):
        list(scan_tar(reader(data), len(data) + 512, where=WHERE))


# --- header factories for hand-made archives -----------------------------------------------


def _header(name: str, size: int, typeflag: bytes) -> bytes:
    block = bytearray(512)
    raw = name.encode()
    block[: len(raw)] = raw
    block[100:108] = b"0000644\0"
    block[108:124] = b"0000000\0" * 2
    block[124:136] = f"{size:011o}\0".encode()
    block[136:148] = b"00000000000\0"
    block[156:157] = typeflag
    block[257:265] = b"ustar\x0000"
    _fix_checksum(block, 0)
    return bytes(block)


def _fix_checksum(data: bytearray, at: int) -> None:
    data[at + 148 : at + 156] = b" " * 8
    data[at + 148 : at + 156] = f"{sum(data[at : at + 512]):06o}\0 ".encode()


def _pad(body: bytes) -> bytes:
    return body + bytes(padded(len(body)) - len(body))


def _pax_record(key: str, value: str) -> bytes:
    text = f" {key}={value}\n".encode()
    n = len(text)
    while len(str(n)) + len(text) != n:
        n = len(str(n)) + len(text)
    return str(n).encode() + text


def _name(rng: random.Random, fmt: int) -> str:
    alphabet = "abcXYZ_-0123456789" + ("é漢" if fmt != tarfile.USTAR_FORMAT else "")
    return "".join(rng.choice(alphabet) for _ in range(rng.choice([1, 5, 30, 110])))
