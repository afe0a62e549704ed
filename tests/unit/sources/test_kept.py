"""Plans kept in ``cache_dir`` between runs (`sources.kept`, `sources.steps`): a restart with
an unchanged listing reads no footer; a changed file is re-read alone and its old facts never
used; a plan kept by another library version or for other options is not used; an unreadable
kept file is planned from scratch."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import torch_dataloader_utils as tdu
from torch_dataloader_utils.formats import Listing
from torch_dataloader_utils.formats.parquet.format import ParquetFormat
from torch_dataloader_utils.sources import kept

FILES, ROWS = 6, 40


@pytest.fixture
def data(tmp_path: Path) -> Path:
    root = tmp_path / "data"
    root.mkdir()
    for f in range(FILES):
        table = pa.table({"id": np.arange(ROWS) + ROWS * f, "x": np.full(ROWS, f)})
        pq.write_table(table, root / f"part-{f}.parquet", row_group_size=15)
    return root


@pytest.fixture
def reads(monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, Any]]:
    """The files whose facts planning reads, and how often it reads a file's schema."""
    seen: dict[str, Any] = {"facts": [], "schema": 0}
    facts, schema = ParquetFormat.facts, ParquetFormat.schema

    def counted_facts(self: ParquetFormat, listing: Listing, *args: Any) -> Any:
        seen["facts"].extend(os.path.basename(f.path) for f in listing.files)
        return facts(self, listing, *args)

    def counted_schema(self: ParquetFormat, *args: Any) -> Any:
        seen["schema"] += 1
        return schema(self, *args)

    monkeypatch.setattr(ParquetFormat, "facts", counted_facts)
    monkeypatch.setattr(ParquetFormat, "schema", counted_schema)
    yield seen


def load(data: Path, cache: Path, seen: dict[str, Any], **options: Any) -> tuple[list[str], str]:
    """Plan and read ``data``; the files whose facts were read, and the plan's fingerprint."""
    seen["facts"].clear()
    seen["schema"] = 0
    loader = tdu.create_dataloader(
        str(data), batch_size=7, shuffle=True, num_workers=0, cache_dir=str(cache), **options
    )
    ids = np.concatenate([b["id"].numpy() for b in loader])
    assert sorted(ids.tolist()) == list(range(FILES * ROWS))  # every row once
    return sorted(seen["facts"]), loader.dataset.plan.fingerprint


def rewrite(path: Path, values: int) -> None:
    """New bytes and a new modification time: a new identity."""
    table = pq.read_table(path)
    table = table.set_column(1, "x", pa.array(np.full(table.num_rows, values)))
    pq.write_table(table, path, row_group_size=15)
    later = time.time() + 10
    os.utime(path, (later, later))


def test_a_restart_reads_no_footer_and_a_changed_file_alone(
    data: Path, tmp_path: Path, reads: dict[str, Any]
) -> None:
    cache = tmp_path / "cache"
    first, fingerprint = load(data, cache, reads)
    assert len(first) == FILES
    again, same = load(data, cache, reads)
    assert again == [] and reads["schema"] == 0 and same == fingerprint
    rewrite(data / "part-3.parquet", 99)
    changed, _ = load(data, cache, reads)
    assert changed == ["part-3.parquet"]
    loader = tdu.create_dataloader(str(data), batch_size=500, num_workers=0, cache_dir=str(cache))
    (batch,) = list(loader)
    assert (batch["x"].numpy()[batch["id"].numpy() // ROWS == 3] == 99).all()  # the new bytes
    assert load(data, cache, reads)[0] == []  # ... kept as they are now


def test_other_options_or_another_version_do_not_use_a_kept_plan(
    data: Path, tmp_path: Path, reads: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    cache = tmp_path / "cache"
    load(data, cache, reads)
    assert len(load(data, cache, reads, columns=["id"])[0]) == FILES  # other columns
    assert len(load(data, cache, reads, split_rows=15)[0]) == FILES  # other chunks
    monkeypatch.setattr(kept, "VERSION", "0.0.0-another")
    assert len(load(data, cache, reads)[0]) == FILES


def test_an_unreadable_kept_plan_is_planned_from_scratch(
    data: Path, tmp_path: Path, reads: dict[str, Any], caplog: pytest.LogCaptureFixture
) -> None:
    cache = tmp_path / "cache"
    load(data, cache, reads)
    (stored,) = (cache / kept.KEPT_FOLDER).glob("*.pickle")
    stored.write_bytes(b"not a pickle")
    assert len(load(data, cache, reads)[0]) == FILES
    assert "unreadable" in caplog.text
    assert load(data, cache, reads)[0] == []  # (and kept again)
    # Facts unreadable, or of another listing: the changed listing reads every file.
    Path(f"{stored}.facts").write_bytes(b"torn")
    rewrite(data / "part-1.parquet", 5)
    assert len(load(data, cache, reads)[0]) == FILES
