"""Values the corpus taught us about, in files written here: each read in the corpus runner's
child process (a crash or a hang fails one case), compared with the reference reader."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests.corpus.cases import Case
from tests.corpus.pool import Runner


@pytest.fixture(scope="module")
def runner() -> Iterator[Runner]:
    found = Runner()
    yield found
    found.close()


def read(runner: Runner, case: Case, **config: Any) -> dict[str, Any]:
    full = {"workers": 0, "output": "arrow", "shuffle": True, "batch_size": 3, **config}
    return runner.run({"case": dataclasses.asdict(case), "config": full}, timeout=120)


@pytest.mark.parametrize("workers", [0, 2])
def test_an_all_empty_csv_column_is_null_as_pyarrow_reads_it(
    runner: Runner, tmp_path: Path, workers: int
) -> None:
    path = tmp_path / "empty.csv"
    path.write_text("id,empty,quoted\n" + "".join(f'{i},,""\n' for i in range(10)))
    for output in ("arrow", "torch"):
        verdict = read(runner, Case(str(path), "csv"), workers=workers, output=output)
        assert verdict["verdict"] == "match" and verdict["rows"] == 10, verdict


def test_a_latin1_header_is_refused_with_the_encoding_to_pass_and_read_with_it(
    runner: Runner, tmp_path: Path
) -> None:
    path = tmp_path / "latin.csv"
    path.write_bytes("id,café\n1,crème\n2,brûlée\n".encode("latin-1"))
    refused = read(runner, Case(str(path), "csv"))
    assert refused["verdict"] == "refused", refused
    assert "encoding" in refused["error"]["message"], refused
    for workers in (0, 2):
        verdict = read(runner, Case(str(path), "csv", {"encoding": "latin-1"}), workers=workers)
        assert verdict["verdict"] == "match" and verdict["rows"] == 2, verdict


def _invalid_utf8(tmp_path: Path) -> Path:
    ids = pa.array(range(6))
    data = b"okbad\xffok"
    offsets = pa.array([0, 2, 2, 6, 6, 8, 8], pa.int32()).buffers()[1]
    strings = pa.Array.from_buffers(pa.string(), 6, [None, offsets, pa.py_buffer(data)])
    path = tmp_path / "bad-utf8.parquet"
    pq.write_table(pa.table({"id": ids, "s": strings}), path)
    return path


@pytest.mark.parametrize("workers", [0, 2])
def test_strings_that_are_not_utf8_are_refused_naming_the_file_for_python_outputs(
    runner: Runner, tmp_path: Path, workers: int
) -> None:
    path = _invalid_utf8(tmp_path)
    verdict = read(runner, Case(str(path), "parquet"), workers=workers, output="torch")
    assert verdict["verdict"] == "refused" and verdict["stage"] == "reading", verdict
    assert verdict["error"]["type"] == "DataError", verdict
    assert "'s'" in verdict["error"]["message"] and "UTF-8" in verdict["error"]["message"]
    # Arrow output hands the bytes over as they are, as pyarrow's reader does.
    assert read(runner, Case(str(path), "parquet"), workers=workers)["verdict"] == "match"


def test_dates_outside_pythons_range_are_refused_naming_the_file_in_dict_output(
    runner: Runner, tmp_path: Path
) -> None:
    path = tmp_path / "far.parquet"
    far = pa.array([0, 100_000 * 365 * 86_400 * 10**6, 1], pa.timestamp("us"))
    pq.write_table(pa.table({"id": pa.array([0, 1, 2]), "t": far}), path)
    verdict = read(runner, Case(str(path), "parquet"), output="dict")
    assert verdict["verdict"] == "refused", verdict
    assert "'t'" in verdict["error"]["message"] and "range" in verdict["error"]["message"]
    # Torch output: the stored integers, as documented.
    assert read(runner, Case(str(path), "parquet"), output="torch")["verdict"] == "match"


@pytest.mark.parametrize("workers", [0, 2])
def test_lists_with_nulls_under_mask_are_read_with_both_masks(
    runner: Runner, tmp_path: Path, workers: int
) -> None:
    path = tmp_path / "lists.parquet"
    lists = pa.array([[1, None], None, [2, 3], [], [None]] * 7, pa.list_(pa.int64()))
    pq.write_table(pa.table({"id": pa.array(range(35)), "seq": lists}), path, row_group_size=8)
    for output in ("torch", "arrow"):
        verdict = read(runner, Case(str(path), "parquet"), workers=workers, output=output)
        assert verdict["verdict"] == "match" and verdict["rows"] == 35, verdict


@pytest.mark.parametrize("workers", [0, 2])
def test_an_unclosed_quote_is_an_error_naming_the_file_and_byte(
    runner: Runner, tmp_path: Path, workers: int
) -> None:
    """pyarrow reads the rest of the file as one value (3,501 of 5,000 rows, no error)."""
    rows = [f"{i},v{i}\n" for i in range(5000)]
    rows[3500] = '3500,"broken\n'
    path = tmp_path / "unclosed.csv"
    path.write_text("id,s\n" + "".join(rows))
    at = path.read_bytes().index(b'"')
    verdict = read(runner, Case(str(path), "csv"), workers=workers)
    assert verdict["verdict"] == "refused" and verdict["stage"] == "planning", verdict
    assert f"quote at byte {at} is never closed" in verdict["error"]["message"], verdict
    # Closed, the same file reads exactly.
    rows[3500] = '3500,"mended"\n'
    path.write_text("id,s\n" + "".join(rows))
    verdict = read(runner, Case(str(path), "csv"), workers=workers)
    assert verdict["verdict"] == "match" and verdict["rows"] == 5000, verdict


@pytest.mark.parametrize("workers", [0, 2])
def test_a_shard_cut_at_a_member_boundary_is_an_error_naming_the_file(
    runner: Runner, tmp_path: Path, workers: int
) -> None:
    """tarfile and webdataset read the samples before the cut without a word."""
    import tarfile

    from tests.corpus.cases import ROOT

    whole = (ROOT / "webdataset/testdata/tendata.tar").read_bytes()
    with tarfile.open(ROOT / "webdataset/testdata/tendata.tar") as archive:
        members = archive.getmembers()
    cut = members[40].offset  # the header of the 41st member: 40 whole members before it
    path = tmp_path / "cut.tar"
    path.write_bytes(whole[:cut])
    options = {"missing_component": "empty", "decode": False, "index_cache_dir": ""}
    verdict = read(runner, Case(str(path), "webdataset", options), workers=workers)
    assert verdict["verdict"] == "refused" and verdict["stage"] == "planning", verdict
    message = verdict["error"]["message"]
    assert f"offset {cut}" in message and "end-of-archive marker" in message, verdict


@pytest.mark.parametrize("workers", [0, 2])
def test_a_flipped_bit_under_a_page_checksum_is_an_error_naming_the_file(
    runner: Runner, tmp_path: Path, workers: int
) -> None:
    """pyarrow's reader returns the wrong value unless asked to verify; we always verify."""
    path = tmp_path / "crc.parquet"
    table = pa.table({"id": pa.array(range(1000)), "x": pa.array(range(1000, 2000))})
    pq.write_table(table, path, compression="none", use_dictionary=False, write_page_checksum=True)
    column = pq.read_metadata(path).row_group(0).column(1)
    data = bytearray(path.read_bytes())
    data[column.data_page_offset + column.total_compressed_size - 9] ^= 0x04  # a value's bit
    path.write_bytes(bytes(data))
    assert pq.read_table(path).column("x").to_pylist() != list(range(1000, 2000))  # silently
    verdict = read(runner, Case(str(path), "parquet"), workers=workers)
    assert verdict["verdict"] == "refused", verdict
    message = verdict["error"]["message"]
    assert "crc.parquet row group 0" in message and "CRC checksum" in message, verdict


@pytest.mark.parametrize("fmt", ["csv", "json"])
def test_a_record_longer_than_the_parse_block_is_read(
    runner: Runner, tmp_path: Path, fmt: str
) -> None:
    """A 34 MiB record: past pyarrow's CSV block (1 MiB), its JSON block (16 MiB) and a chunk
    fetched in one piece (32 MiB); it used to be refused as invalid ("straddling object")."""
    big = "x" * (34 << 20)
    if fmt == "csv":
        text = f"id,s\n0,a\n1,{big}\n2,b\n"
    else:
        text = '{"id": 0, "s": "a"}\n{"id": 1, "s": "' + big + '"}\n{"id": 2, "s": "b"}\n'
    path = tmp_path / f"long.{fmt}"
    path.write_text(text)
    del big, text
    for workers in (0, 2):
        verdict = read(runner, Case(str(path), fmt), workers=workers, batch_size=2)
        assert verdict["verdict"] == "match" and verdict["rows"] == 3, verdict
