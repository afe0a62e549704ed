"""The log's version selection: versions listed, times and version numbers taken. (Opening
real tables, and their errors: tests/delta/test_tables.py.)"""

from __future__ import annotations

import sys
from datetime import UTC, datetime
from pathlib import Path

import pytest

from torch_dataloader_utils.delta.log import _instant, _spans, _version, log_versions
from torch_dataloader_utils.errors import InvalidArgumentError
from torch_dataloader_utils.fs import FileSystemSpec


def test_versions_listed_and_told_as_spans(tmp_path: Path) -> None:
    log = tmp_path / "_delta_log"
    log.mkdir()
    for v in (0, 1, 2, 5):
        (log / f"{v:020d}.json").write_text("{}")
    (log / f"{2:020d}.checkpoint.parquet").write_bytes(b"")
    assert log_versions(str(tmp_path), FileSystemSpec("file")) == [0, 1, 2, 5]
    assert log_versions(str(tmp_path / "none"), FileSystemSpec("file")) == []
    assert _spans([0, 1, 2, 5]) == "0..2, 5"
    assert _spans([]) == "none listed"


def test_times_and_version_numbers() -> None:
    assert _instant(1_700_000_000_000) == datetime(2023, 11, 14, 22, 13, 20, tzinfo=UTC)
    aware = datetime(2026, 1, 1, tzinfo=UTC)
    assert _instant(aware) is aware
    assert _instant(datetime(2026, 1, 1)).tzinfo is not None  # naive: local time
    with pytest.raises(InvalidArgumentError, match="as_of"):
        _instant("yesterday")  # type: ignore[arg-type]
    assert _version("3", "t") == 3
    for bad in (-1, "x", True):
        with pytest.raises(InvalidArgumentError, match="t: version"):
            _version(bad, "t")


def test_a_missing_deltalake_or_pyroaring_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    from torch_dataloader_utils.delta.log import require_deltalake
    from torch_dataloader_utils.errors import MissingDependencyError
    from torch_dataloader_utils.sources.deletion_vectors import bitmap_positions

    monkeypatch.setitem(sys.modules, "deltalake", None)
    monkeypatch.setitem(sys.modules, "pyroaring", None)
    with pytest.raises(MissingDependencyError, match=r"torch-dataloader-utils\[delta\]"):
        require_deltalake()
    with pytest.raises(MissingDependencyError, match=r"vector v.*\[delta\]"):
        bitmap_positions(b"", "vector v")
