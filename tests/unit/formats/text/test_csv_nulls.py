"""CSV nulls as pyarrow reads them (issue 28): a column whose every sampled value is a null
token (``null``, ``NULL``, ``n/a``, empty) is all nulls, compared with ``pyarrow.csv.read_csv``
on the same file; and where a null of a numeric column comes from (`CsvFormat.null_origin`)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.csv as pacsv
import pytest

from torch_dataloader_utils.formats import Listing, ReadOptions
from torch_dataloader_utils.formats.text import CsvFormat
from torch_dataloader_utils.fs import FileSystemSpec, list_files

FS = FileSystemSpec("file")


def _read(fmt: CsvFormat, path: Path) -> tuple[pa.Table, object]:
    files = list_files(str(path), FS)
    plan = fmt.plan(Listing.of(files), FS, ReadOptions())
    batches = [b for c in plan.chunks for b in fmt.read(c, 0, c.num_rows, FS, plan.read_options)]
    return pa.Table.from_batches(batches, schema=plan.schema), plan


@pytest.mark.parametrize(
    "column",
    [
        ["null", "null", "null"],
        ["NULL", "", "n/a"],
        ["", "", ""],
        ["null", "NaN", "N/A"],
        ["null", "x", "null"],  # a string column: pyarrow keeps the text
        ["1", "null", "n/a"],  # an int column with nulls
    ],
)
def test_null_tokens_read_as_pyarrow_reads_them(tmp_path: Path, column: list[str]) -> None:
    path = tmp_path / "n.csv"
    path.write_text("id,v\n" + "".join(f"{i},{v}\n" for i, v in enumerate(column)))
    table, _ = _read(CsvFormat(), path)
    expected = pacsv.read_csv(path)
    assert table.column("id").to_pylist() == [0, 1, 2]
    assert table.column("v").to_pylist() == expected.column("v").to_pylist()


def test_given_null_values_apply_to_an_all_null_column(tmp_path: Path) -> None:
    path = tmp_path / "n.csv"
    path.write_text("id,v\n0,-\n1,-\n")
    table, _ = _read(CsvFormat(null_values=["-"]), path)
    options = pacsv.ConvertOptions(null_values=["-"])
    assert table.to_pydict() == pacsv.read_csv(path, convert_options=options).to_pydict()
    assert table.column("v").to_pylist() == [None, None]


def test_null_origin_names_the_value_and_its_line(tmp_path: Path) -> None:
    path = tmp_path / "n.csv"
    path.write_text("id,x\n1,2\n2,n/a\n3,4\n")
    fmt = CsvFormat()
    table, plan = _read(fmt, path)
    assert table.column("x").to_pylist() == [2, None, 4]
    (chunk,) = plan.chunks
    where = fmt.null_origin(chunk, "x", FS, plan.read_options)
    assert "'n/a'" in where and "line 3" in where, where


def test_a_refused_null_names_the_text_that_made_it(tmp_path: Path) -> None:
    """``n/a`` in a numeric column is a null to pyarrow; torch output (null_policy="error")
    refuses it naming the file, the column, the text and its line. In its own process (bad
    input): a crash or a hang fails this test only."""
    (tmp_path / "a.csv").write_text("id,x\n1,2\n2,n/a\n3,4\n")
    script = (
        "import sys, torch_dataloader_utils as tdu\n"
        "loader = tdu.create_dataloader(sys.argv[1], format='csv', num_workers=0, batch_size=2)\n"
        "try:\n    list(loader)\nexcept tdu.NullValueError as exc:\n    print(exc)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script, str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    message = done.stdout.strip()
    assert "a.csv" in message and "column 'x'" in message, message
    assert "the first null: value 'n/a' at line 3" in message, message
