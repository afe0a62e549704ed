"""Record boundaries (`RecordScan`) and chunk cutting (`ChunkCutter`), checked against
pyarrow's own parsers and against brute force, for every way of cutting the bytes into pieces."""

from __future__ import annotations

import io
import random

import numpy as np
import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.json as pajson
import pytest

from torch_dataloader_utils.formats.records import ChunkCutter, RecordScan, compression_of


def csv_scan() -> RecordScan:
    return RecordScan(quote=ord('"'), delimiter=ord(","), blank=b"\r", bare_cr_ends_records=True)


def json_scan() -> RecordScan:
    return RecordScan(quote=None, delimiter=None, blank=b" \t\r", bare_cr_ends_records=False)


def scan_ends(scan: RecordScan, data: bytes, piece: int) -> list[int]:
    ends: list[int] = []
    for i in range(0, len(data), piece):
        ends.extend(scan.feed(data[i : i + piece]).tolist())
    ends.extend(scan.finish().tolist())
    return ends


def csv_rows(data: bytes) -> int:
    """Rows pyarrow reads from ``data`` (no header), quoted newlines allowed."""
    if not data.strip(b"\r\n"):
        return 0
    if b"\n" not in data:  # pyarrow needs one line end to see the first row
        data += b"\n"
    return pacsv.read_csv(
        io.BytesIO(data),
        read_options=pacsv.ReadOptions(autogenerate_column_names=True),
        parse_options=pacsv.ParseOptions(newlines_in_values=True),
    ).num_rows


@pytest.mark.parametrize(
    ("data", "ends"),
    [
        (b"", []),
        (b"a,b\n", [4]),
        (b"a,b", [3]),  # no trailing newline: the last record ends at the end of the file
        (b"a\n\nb\n", [2, 5]),  # an empty line is not a record
        (b"a\r\n\r\nb\r\n", [3, 8]),  # nor is an empty CRLF line
        (b'"x\ny",1\nz,2\n', [8, 12]),  # a quoted newline
        (b'"x\r\ny",1\r\nz,2', [10, 13]),  # a quoted CRLF
        (b'"a""\nb",1\n"""",2\n', [10, 17]),  # doubled quotes keep the parity
        (b'"",\n,""\n', [4, 8]),  # empty quoted values
    ],
)
def test_csv_record_ends_in_any_pieces(data: bytes, ends: list[int]) -> None:
    for piece in range(1, len(data) + 2):
        scan = csv_scan()
        assert scan_ends(scan, data, piece) == ends, piece
        assert scan.unreliable is None
    assert len(ends) == csv_rows(data)


@pytest.mark.parametrize(
    ("data", "why"),
    [
        (b'ab"c\nd\n', "quote character inside an unquoted field at byte 2"),
        (b'a,"b"\nc,d"e,f"\n', "at byte 9"),
        (b'"b" "c"\n', "at byte 4"),
        (b"a\rb\n", "bare carriage return ends a record at byte 1"),
        (b'"open\n', "not closed"),
    ],
)
def test_csv_scan_says_when_parity_cannot_be_trusted(data: bytes, why: str) -> None:
    for piece in range(1, len(data) + 1):
        scan = csv_scan()
        scan_ends(scan, data, piece)
        assert scan.unreliable is not None and why in scan.unreliable, (piece, scan.unreliable)


def test_a_carriage_return_inside_quotes_is_fine() -> None:
    data = b'"a\rb",1\n"c\r",2\n'
    for piece in range(1, len(data) + 1):
        scan = csv_scan()
        assert scan_ends(scan, data, piece) == [8, 15]
        assert scan.unreliable is None
    assert csv_rows(data) == 2


def random_csv(rng: random.Random, rows: int) -> bytes:
    """Rows of 3 fields: plain, quoted with delimiters, newlines, CRLF and doubled quotes;
    empty lines between some rows; CRLF or LF line ends."""
    pieces = ["a", "b,c", 'say ""hi""', "x\ny", "x\r\ny", "", "\n", '""', "z\r\n\n"]
    out = []
    for _ in range(rows):
        fields = []
        for _ in range(3):
            value = rng.choice(pieces)
            quoted = rng.random() < 0.5 or any(c in value for c in ',\n\r"')
            fields.append(f'"{value}"' if quoted else value)
        out.append(",".join(fields) + rng.choice(["\n", "\r\n"]))
        if rng.random() < 0.1:
            out.append(rng.choice(["\n", "\r\n"]))
    text = "".join(out)
    if rng.random() < 0.5:
        text = text.rstrip("\r\n")  # no trailing newline
    return text.encode()


def test_csv_counts_agree_with_pyarrow_for_random_files() -> None:
    rng = random.Random(7)
    for trial in range(60):
        data = random_csv(rng, rng.randint(0, 40))
        want = csv_rows(data)
        for piece in {1, 2, 3, 7, rng.randint(1, 64), max(1, len(data))}:
            scan = csv_scan()
            ends = scan_ends(scan, data, piece)
            assert scan.unreliable is None
            assert len(ends) == want, (trial, piece, data)


def test_json_blank_lines_crlf_and_no_trailing_newline() -> None:
    data = b'\n{"a": 1}\r\n  \n\t\r\n{"a": 2}\n\n{"a": 3}'
    want = pajson.read_json(io.BytesIO(data)).num_rows
    assert want == 3
    for piece in range(1, len(data) + 1):
        ends = scan_ends(json_scan(), data, piece)
        assert len(ends) == want
        assert ends[-1] == len(data)


def test_json_quotes_do_not_matter() -> None:
    data = b'{"a": "x\\"y"}\n{"a": "\\""}\n'
    assert scan_ends(json_scan(), data, 3) == [14, len(data)]


def cut(
    ends: list[int], start: int, size: int, **targets: int | None
) -> list[tuple[int, int, int]]:
    cutter = ChunkCutter(start, targets.get("max_rows"), targets.get("max_bytes"))
    for i in range(0, len(ends), 3):  # fed in several arrays
        cutter.feed(np.array(ends[i : i + 3], dtype=np.int64))
    return cutter.finish(size)


def test_cutter_by_rows_bytes_and_both() -> None:
    ends = [10, 15, 40, 41, 42, 100]
    assert cut(ends, 0, 100, max_rows=1) == [
        (0, 10, 1),
        (10, 15, 1),
        (15, 40, 1),
        (40, 41, 1),
        (41, 42, 1),
        (42, 100, 1),
    ]
    assert cut(ends, 0, 100, max_rows=4) == [(0, 41, 4), (41, 100, 2)]
    # A chunk closes at the first record end at or past the target.
    assert cut(ends, 0, 120, max_bytes=12) == [(0, 15, 2), (15, 40, 1), (40, 120, 3)]
    assert cut(ends, 5, 100, max_rows=2, max_bytes=30) == [(5, 15, 2), (15, 41, 2), (41, 100, 2)]
    assert cut([], 7, 7, max_rows=2) == []
    assert cut([3], 0, 9, max_bytes=1 << 20) == [(0, 9, 1)]  # trailing blank bytes included


def test_cutter_matches_brute_force() -> None:
    rng = np.random.default_rng(3)
    for _ in range(200):
        ends = np.cumsum(rng.integers(1, 20, rng.integers(0, 30))).tolist()
        max_rows = int(rng.integers(1, 6)) if rng.random() < 0.7 else None
        max_bytes = int(rng.integers(1, 60)) if rng.random() < 0.7 or max_rows is None else None
        size = (ends[-1] if ends else 0) + int(rng.integers(0, 3))
        want: list[tuple[int, int, int]] = []
        start, rows = 0, 0
        for e in ends:
            rows += 1
            if (max_rows is not None and rows >= max_rows) or (
                max_bytes is not None and e - start >= max_bytes
            ):
                want.append((start, e, rows))
                start, rows = e, 0
        if rows:
            want.append((start, size, rows))
        elif want:
            want[-1] = (want[-1][0], size, want[-1][2])
        assert cut(ends, 0, size, max_rows=max_rows, max_bytes=max_bytes) == want


@pytest.mark.parametrize(
    ("path", "codec"),
    [
        ("a.csv.gz", "gzip"),
        ("a.JSONL.ZST", "zstd"),
        ("b.bz2", "bz2"),
        ("c.xz", "xz"),
        ("d.csv", None),
    ],
)
def test_compression_by_extension(path: str, codec: str | None) -> None:
    assert compression_of(path) == codec
    if codec not in (None, "xz"):
        assert pa.Codec.is_available(codec)
