"""The ``tdu`` command line: ``tdu demo`` and ``tdu plan`` in process; ordinary mistakes of
every subcommand through the installed ``tdu`` entry point, in a subprocess (``tdu explain``:
tests/unit/cli/test_explain.py)."""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests.conftest import write_parquet
from tests.unit.cli.commands import assert_one_line, tdu
from torch_dataloader_utils.cli import main, parser

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


# --- mistakes: one line on stderr, exit status 2 ------------------------------------------------


@pytest.fixture
def mixed(tmp_path: Path) -> Path:
    """Two Parquet files whose ``id`` columns disagree on their type."""
    root = tmp_path / "mixed"
    write_parquet(root / "a.parquet", np.arange(10))
    table = pa.table({"id": pa.array([str(i) for i in range(10)])})
    pq.write_table(table, root / "b.parquet")
    return root


@pytest.mark.parametrize("command", ["plan", "read"])
def test_a_missing_path_is_one_line(tmp_path: Path, command: str) -> None:
    missing = tmp_path / "nowhere"
    assert_one_line(tdu(command, str(missing)), command, str(missing), "not found")


@pytest.mark.parametrize("command", ["plan", "read"])
def test_an_unknown_format_is_one_line(tmp_path: Path, command: str) -> None:
    write_parquet(tmp_path / "d" / "a.parquet", np.arange(10))
    done = tdu(command, str(tmp_path / "d"), "--format", "nope")
    assert_one_line(done, command, "unknown format 'nope'", "parquet")


def test_mixed_schemas_are_one_line(mixed: Path) -> None:
    assert_one_line(tdu("plan", str(mixed)), "plan", "disagree on the schema", "id: string")


def test_an_error_in_a_worker_is_one_line_without_its_traceback(tmp_path: Path) -> None:
    # A value that does not parse, met by one of tdu read's 2 workers: torch re-raises it in
    # the main process with the worker's traceback; the line is the error itself.
    data = tmp_path / "csv"
    data.mkdir()
    (data / "a.csv").write_text("id,x\n" + "".join(f"{i},{i}.5\n" for i in range(100)))
    (data / "b.csv").write_text("id,x\n100,1.5\n101,oops\n")  # types come from a.csv
    done = tdu("read", str(data), "--format", "csv", "--workers", "2", "--epochs", "1")
    progress = [line for line in done.stderr.splitlines() if "batch/s" in line or not line]
    done.stderr = "\n".join(line for line in done.stderr.splitlines() if line not in progress)
    assert_one_line(done, "read", "b.csv", "value 'oops' at line 3", "is not a valid double")
    assert "Traceback" not in done.stderr and "CorruptFileError" not in done.stderr


def test_bad_storage_options_json_is_one_line(tmp_path: Path) -> None:
    write_parquet(tmp_path / "d" / "a.parquet", np.arange(10))
    done = tdu("read", str(tmp_path / "d"), "--storage-options", "{anon: true}")
    assert_one_line(done, "read", "Expecting property name")


def test_a_missing_shard_and_no_cache_dir_are_one_line(tmp_path: Path) -> None:
    assert_one_line(tdu("index", str(tmp_path / "no.tar")), "index", "no.tar")
    done = tdu("cache", TDU_CACHE_DIR="")
    assert_one_line(done, "cache", "no cache directory")


@pytest.mark.parametrize(
    ("args", "env"),
    [(["--traceback", "plan"], {}), (["plan", "--traceback"], {}), (["plan"], {"TDU_DEBUG": "1"})],
)
def test_the_traceback_on_request(tmp_path: Path, args: list[str], env: dict[str, str]) -> None:
    done = tdu(*args, str(tmp_path / "nowhere"), **env)
    assert done.returncode == 1
    assert "Traceback (most recent call last)" in done.stderr
    assert "StorageNotFoundError" in done.stderr


def test_every_option_shows_its_default() -> None:
    top = parser()
    subcommands = next(a for a in top._actions if isinstance(a, argparse._SubParsersAction)).choices
    assert sorted(subcommands) == ["cache", "demo", "explain", "index", "plan", "profile", "read"]
    for name, sub in [("tdu", top), *subcommands.items()]:
        formatter = sub._get_formatter()
        for action in sub._actions:
            if isinstance(action, argparse._HelpAction | argparse._SubParsersAction):
                continue
            if not action.option_strings and action.nargs is None:
                continue  # a required positional: no default to show
            shown = formatter._get_help_string(action) or ""  # what --help prints
            if action.required:  # none to show: it says it is required
                assert "default" not in shown and "required" in shown, (name, action.dest, shown)
                continue
            assert "default" in shown, (name, action.dest, shown)
