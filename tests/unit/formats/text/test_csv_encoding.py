"""A CSV value that is not UTF-8: refused naming the file, the column, the line, and how to
read it (``format_options={"encoding": ...}``, or the column as binary); read right with the
encoding given."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pytest

import torch_dataloader_utils as tdu

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def latin1(tmp_path: Path) -> Path:
    """A Latin-1 CSV whose first rows are ASCII: its types are inferred from them (as string)
    before the 'café' of row 150 (line 152) is met."""
    path = tmp_path / "people.csv"
    rows = [f"{i},name-{i:05d}".encode() for i in range(300)]
    rows[150] = "150,café".encode("latin-1")
    path.write_bytes(b"id,name\n" + b"\n".join(rows) + b"\n")
    return path


def _read(path: Path, **options: object) -> list[dict[str, list[object]]]:
    loader = tdu.create_dataloader(
        path, format="csv", num_workers=0, batch_size=1000, output_format="dict", **options
    )
    return list(loader)


@pytest.mark.parametrize(
    "format_options",
    [
        {"infer_bytes": 1000},  # inferred from the first 1,000 bytes
        {"schema": pa.schema([("id", pa.int64()), ("name", pa.string())])},
    ],
)
def test_a_value_not_utf8_is_refused_saying_how_to_read_it(
    latin1: Path, format_options: dict[str, object]
) -> None:
    with pytest.raises(tdu.CorruptFileError) as info:
        _read(latin1, format_options=format_options)
    message = str(info.value)
    assert message.startswith(f"{latin1} bytes ")  # the file
    assert "column 'name': a value at line 152" in message and "is not UTF-8 text" in message
    assert "format_options={'encoding': ...}" in message and "'latin-1'" in message
    assert "pyarrow.binary() for 'name'" in message


def test_the_encoding_it_names_reads_the_file(latin1: Path) -> None:
    (batch,) = _read(latin1, format_options={"encoding": "latin-1", "infer_bytes": 1000})
    assert batch["name"][150] == "café" and len(batch["name"]) == 300


def test_a_value_after_a_lone_carriage_return_is_refused_naming_its_row(tmp_path: Path) -> None:
    """pyarrow ends a record at a lone ``\\r``, the record scan does not: the value is placed by
    its row (it raised an IndexError)."""
    path = tmp_path / "cr.csv"
    path.write_bytes(b"a,b\r\x80,")
    with pytest.raises(tdu.CorruptFileError, match=r"cr\.csv.*column 'a'.*row 0.*encoding"):
        _read(path)


def test_empty_lines_before_a_header_that_is_renamed_are_refused(tmp_path: Path) -> None:
    """A header with an empty name is read under new names by skipping its line by count,
    which an empty line before it would shift (its names read as a row)."""
    path = tmp_path / "blank.csv"
    path.write_bytes(b"\r,b\n1,2\n3,4\n")
    with pytest.raises(tdu.UnsupportedFileError, match=r"blank\.csv.*empty lines come before"):
        _read(path)
    path.write_bytes(b",b\n1,2\n3,4\n")  # (without them, read as column0)
    assert _read(path)[0]["column0"] == [1, 3]
