"""The ``tdu`` command line, run in process: ``tdu demo`` and ``tdu plan``."""

from __future__ import annotations

from pathlib import Path

import pyarrow.parquet as pq
import pytest

from torch_dataloader_utils.cli import main

pytestmark = pytest.mark.timeout(60)

ROWS = 2000


def demo(directory: Path) -> int:
    return main(["demo", "--rows", str(ROWS), "--workers", "0", "--dir", str(directory)])


def files_of(directory: Path) -> dict[str, tuple[int, int]]:
    """Each file's name -> (inode, modification time in ns)."""
    return {p.name: (p.stat().st_ino, p.stat().st_mtime_ns) for p in sorted(directory.iterdir())}


def test_demo_reads_every_row_once_and_reuses_its_data(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    directory = tmp_path / "demo"
    assert demo(directory) == 0
    out = capsys.readouterr().out
    assert "num_workers=0: 2,000 rows" in out
    assert "exactly once: yes" in out
    parquet = sorted(directory.glob("*.parquet"))
    assert parquet
    ids = sorted(i for p in parquet for i in pq.read_table(p, columns=["id"])["id"].to_pylist())
    assert ids == list(range(ROWS))
    written = files_of(directory)
    assert demo(directory) == 0  # a second run reads the same files, not rewritten ones
    assert "exactly once: yes" in capsys.readouterr().out
    assert files_of(directory) == written


@pytest.mark.parametrize("user_file", ["notes.txt", "part-000.parquet", "_SUCCESS"])
def test_demo_refuses_a_directory_that_is_not_a_demo_dataset(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], user_file: str
) -> None:
    directory = tmp_path / "mine"
    directory.mkdir()
    (directory / user_file).write_bytes(b"precious")
    with pytest.raises(SystemExit) as info:
        demo(directory)
    assert info.value.code not in (0, None)
    assert str(directory) in str(info.value.code)
    assert (directory / user_file).read_bytes() == b"precious"  # never deleted
    assert sorted(p.name for p in directory.iterdir()) == [user_file]
    assert "exactly once" not in capsys.readouterr().out


def test_demo_fills_an_existing_empty_directory(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    directory = tmp_path / "empty"
    directory.mkdir()
    assert demo(directory) == 0
    assert "exactly once: yes" in capsys.readouterr().out


def test_plan_prints_the_summary(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    directory = tmp_path / "demo"
    assert demo(directory) == 0
    capsys.readouterr()
    assert main(["plan", str(directory), "--limit", "3"]) == 0
    out = capsys.readouterr().out.splitlines()
    files = len(list(directory.glob("*.parquet")))
    assert out[0].startswith("plan ")
    assert f": {files} files, " in out[0] and f", {ROWS} rows, " in out[0]
    assert any(line.startswith("id: int64") for line in out)
    chunks = [line for line in out if line.startswith("  ") and "rows=" in line]
    assert len(chunks) == 3
    assert all(str(directory) in line for line in chunks)
