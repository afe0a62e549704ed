"""`formats.opening.open_to_read_at`: a local file read at offsets (`LocalFile`, planning's
footer reads) as pyarrow's file reads it, and storage failures named as `open_input` names
them."""

from __future__ import annotations

from pathlib import Path

import pytest

from torch_dataloader_utils.errors import StorageNotFoundError
from torch_dataloader_utils.formats.opening import LocalFile, open_input, open_to_read_at
from torch_dataloader_utils.fs import FileSystemSpec


def test_a_local_file_reads_at_offsets_as_pyarrow_reads_it(tmp_path: Path) -> None:
    path = tmp_path / "f.bin"
    path.write_bytes(bytes(range(256)) * 40)
    fs = FileSystemSpec("file")
    with open_to_read_at(str(path), fs) as local, open_input(str(path), fs) as arrow:
        assert isinstance(local, LocalFile)
        assert local.size() == arrow.size() == 10_240
        for nbytes, offset in [(8, 0), (100, 10_140), (64 << 10, 0), (50, 10_230), (10, 10_240)]:
            assert local.read_at(nbytes, offset) == arrow.read_at(nbytes, offset)


def test_a_missing_local_file_is_not_found_naming_it(tmp_path: Path) -> None:
    missing = tmp_path / "gone.parquet"
    with pytest.raises(StorageNotFoundError, match=r"gone\.parquet"):
        open_to_read_at(str(missing), FileSystemSpec("file"))
