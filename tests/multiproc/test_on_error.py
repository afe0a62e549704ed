"""``on_error="skip"``: a chunk or sample that cannot be read is replaced by rows read before it
in the same stream (the batch count stays as planned), logged once and counted on the loader
and in its state; ``"raise"`` names the file. Each scenario runs in a process of its own."""

from __future__ import annotations

import io
import json
import subprocess
import sys
import tarfile
from collections import Counter
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

REPO = Path(__file__).resolve().parents[2]
FILES, ROWS, GROUP = 4, 100, 50  # ids 0..399, row groups of 50 rows

pytestmark = pytest.mark.timeout(180)


def scenario(**spec: Any) -> dict[str, Any]:
    done = subprocess.run(
        [sys.executable, "-m", "tests.multiproc.skip_scenario", json.dumps(spec)],
        cwd=REPO,
        check=False,
        capture_output=True,
        text=True,
        timeout=150,
    )
    assert done.returncode == 0, done.stderr[-5000:]
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    result["log"] = done.stderr
    return result


def parquet_dir(root: Path, *, corrupt: bool) -> tuple[Path, Path]:
    """4 files of ids 0..399 with page checksums; file 2's second row group (ids 250..299)
    has a flipped bit in its data page when ``corrupt``. Returns (directory, file 2)."""
    root.mkdir()
    for i in range(FILES):
        ids = list(range(i * ROWS, (i + 1) * ROWS))
        table = pa.table({"id": pa.array(ids, pa.int64()), "x": [float(v) for v in ids]})
        pq.write_table(
            table,
            root / f"part-{i}.parquet",
            row_group_size=GROUP,
            compression="none",
            write_page_checksum=True,
        )
    bad = root / "part-2.parquet"
    if corrupt:
        meta = pq.ParquetFile(bad).metadata
        column = meta.row_group(1).column(0)
        offset = column.data_page_offset + column.total_compressed_size - 8
        data = bytearray(bad.read_bytes())
        data[offset] ^= 0x10
        bad.write_bytes(bytes(data))
    return root, bad


def assert_replaced(ids: list[int], lost: set[int]) -> None:
    """Every id but ``lost`` once, and as many repeats of other ids as ``lost`` has."""
    counts = Counter(ids)
    universe = set(range(FILES * ROWS))
    assert len(ids) == len(universe)
    assert set(counts) == universe - lost
    assert sum(n - 1 for n in counts.values()) == len(lost)


@pytest.mark.parametrize(
    ("workers", "context"), [(0, "fork"), (2, "fork"), (2, "spawn")], ids=["0", "fork", "spawn"]
)
def test_a_corrupt_chunk_is_replaced_counted_and_logged(
    tmp_path: Path, workers: int, context: str
) -> None:
    data, bad = parquet_dir(tmp_path / "d", corrupt=True)
    raised = scenario(data=str(data), workers=workers, context=context)
    assert raised["error"]["type"] == "CorruptFileError", raised
    assert str(bad) in raised["error"]["message"]

    got = scenario(data=str(data), workers=workers, context=context, on_error="skip")
    assert "error" not in got, got
    assert_replaced(got["ids"], set(range(250, 300)))
    assert got["batches"] == got["len"] == 25  # as planned: 400 rows of 16
    (failure,) = got["failures"]
    assert failure["file"] == str(bad) and failure["skipped"] == 50, failure
    assert failure["error"] == "CorruptFileError" and "chunk 1:2" in failure["rows"]
    assert got["state"] == {"failures": 1, "rows": 50}
    assert got["log"].count(f"on_error='skip': {bad}") == 1, got["log"]


def test_without_skipping_nothing_is_counted(tmp_path: Path) -> None:
    data, _ = parquet_dir(tmp_path / "d", corrupt=False)
    got = scenario(data=str(data), workers=2, on_error="skip")
    assert Counter(got["ids"]) == Counter(range(FILES * ROWS))
    assert got["failures"] == [] and got["state"] == {"failures": 0, "rows": 0}


def test_a_file_deleted_after_planning_is_skipped_whole(tmp_path: Path) -> None:
    data, bad = parquet_dir(tmp_path / "d", corrupt=False)
    got = scenario(
        data=str(data), workers=2, on_error="skip", shuffle=False, delete_after_planning=str(bad)
    )
    assert_replaced(got["ids"], set(range(200, 300)))
    assert {f["error"] for f in got["failures"]} == {"StorageNotFoundError"}
    assert sum(f["skipped"] for f in got["failures"]) == 100


def test_the_first_chunk_of_a_stream_is_replaced_by_the_rows_after_it(tmp_path: Path) -> None:
    data, bad = parquet_dir(tmp_path / "d", corrupt=False)
    (data / "part-0.parquet").rename(data / "part-9.parquet")  # file 2 is read first
    got = scenario(
        data=str(data), workers=0, on_error="skip", shuffle=False, delete_after_planning=str(bad)
    )
    assert_replaced(got["ids"], set(range(200, 300)))


def test_a_stream_with_no_readable_row_raises(tmp_path: Path) -> None:
    data, bad = parquet_dir(tmp_path / "d", corrupt=False)
    for other in data.iterdir():
        if other != bad:
            other.unlink()
    got = scenario(data=str(data), on_error="skip", delete_after_planning=str(bad))
    assert got["error"]["type"] == "StorageNotFoundError", got
    assert "could not replace" in got["error"]["message"] and str(bad) in got["error"]["message"]


def test_resume_after_a_skip_finishes_the_epoch_as_planned(tmp_path: Path) -> None:
    data, _ = parquet_dir(tmp_path / "d", corrupt=True)
    got = scenario(data=str(data), workers=2, on_error="skip", resume_after=10)
    assert got["batches"] == 25 and len(got["ids"]) == FILES * ROWS
    counts = Counter(got["ids"])
    assert set(counts) <= set(range(FILES * ROWS))


def _shard(path: Path, broken: set[int]) -> Path:
    with tarfile.open(path, "w", format=tarfile.USTAR_FORMAT) as tar:
        for i in range(40):
            for ext, payload in (
                ("id", str(i).encode()),
                ("json", b"{not json" if i in broken else json.dumps({"v": i}).encode()),
            ):
                info = tarfile.TarInfo(f"{i:04d}.{ext}")
                info.size = len(payload)
                tar.addfile(info, io.BytesIO(payload))
    return path


@pytest.mark.parametrize("workers", [0, 2])
def test_a_sample_that_does_not_decode_is_replaced_whole(tmp_path: Path, workers: int) -> None:
    shard = _shard(tmp_path / "a.tar", {7, 23})
    raised = scenario(data=str(shard), format="webdataset", workers=workers, batch_size=8)
    message = raised["error"]["message"]
    assert raised["error"]["type"] == "CorruptFileError" and f"{shard}: sample" in message
    assert "sample '0007'" in message or "sample '0023'" in message
    got = scenario(
        data=str(shard), format="webdataset", workers=workers, batch_size=8, on_error="skip"
    )
    assert "error" not in got, got
    counts = Counter(got["ids"])
    assert len(got["ids"]) == 40 and set(counts) == set(range(40)) - {7, 23}
    assert {f["rows"] for f in got["failures"]} == {"sample '0007'", "sample '0023'"}
    assert all(f["file"] == str(shard) for f in got["failures"])
    assert got["state"] == {"failures": 2, "rows": 2}
