"""Shared data factories: every test makes the small files it reads (no committed binaries but
the Delta tables real writers made, `tests/delta/data/NOTICE.md`).

Also the tiers: each test is marked with the tier of its folder (`TIERS`), so
``pytest -m <tier>`` runs one tier alone.
"""

from __future__ import annotations

import traceback
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

# Imported whole here first: pytest-xdist's controller imports a warning's module when a worker
# reports one, from a thread per worker, and two first imports at once see a half-made package.
import torch_dataloader_utils  # noqa: F401

# The folder under tests/ -> the marker of its tests (declared in pyproject.toml; the README
# lists one line per tier). tests/services/ holds the storage servers' code, no tests.
TIERS = {
    "unit": "unit",
    "conformance": "conformance",
    "multiproc": "multiproc",
    "distributed": "distributed",
    "iceberg": "iceberg",
    "remote": "remote",
    "hub": "remote",
    "delta": "tables",
    "lance": "tables",
    "corpus": "corpus",
    "trainers": "trainers",
}
TESTS = Path(__file__).resolve().parent


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark every test under tests/ with its folder's tier; a folder with no tier is an error,
    so that the tiers always add up to the whole suite."""
    for item in items:
        try:
            folder = item.path.resolve().relative_to(TESTS).parts[0]
        except ValueError:  # collected from outside tests/ (a doctest, say): no tier
            continue
        if folder not in TIERS:
            raise pytest.UsageError(
                f"{item.nodeid}: tests/{folder} has no tier; add it to TIERS in "
                "tests/conftest.py and to the markers in pyproject.toml"
            )
        item.add_marker(TIERS[folder])
    # Files with the most slow tests first: the two test processes take whole files in this
    # order (scripts/test.sh, --dist loadfile), so a trainer's minutes do not start last and
    # leave one process working alone at the end.
    slow: dict[Path, int] = {}
    for item in items:
        slow[item.path] = slow.get(item.path, 0) + (item.get_closest_marker("slow") is not None)
    items.sort(key=lambda item: -slow[item.path])  # (stable: each file's tests keep their order)


def make_table(ids: np.ndarray, *, seed: int = 0, emb_dim: int = 4) -> pa.Table:
    """A table whose rows are identified by ``id``, with every column kind the library maps.

    Values are functions of the id, so a test can check a row's content from its id alone.
    """
    ids = np.asarray(ids, dtype=np.int64)
    n = len(ids)
    lengths = (ids % 5).astype(np.int32)
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
    tokens = (
        np.concatenate(
            [np.arange(k, dtype=np.int32) + int(i) for i, k in zip(ids, lengths, strict=True)]
        )
        if n
        else np.array([], np.int32)
    )
    emb = (ids[:, None] * 10 + np.arange(emb_dim)[None, :]).astype(np.float32).reshape(-1)
    return pa.table(
        {
            "id": pa.array(ids),
            "x": pa.array((ids * 0.5).astype(np.float32)),
            "label": pa.array((ids % 7).astype(np.int64)),
            "flag": pa.array(ids % 2 == 0),
            "name": pa.array([f"row-{i}" for i in ids], pa.string()),
            "emb": pa.FixedSizeListArray.from_arrays(pa.array(emb), emb_dim),
            "tokens": pa.ListArray.from_arrays(pa.array(offsets), pa.array(tokens, pa.int32())),
        }
    )


def write_parquet(path: Path, ids: np.ndarray, *, row_group_size: int = 100, **kw: object) -> Path:
    """Write ``make_table(ids)`` to ``path`` with small row groups."""
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(make_table(ids, **kw), path, row_group_size=row_group_size)
    return path


MakeParquetDir = Callable[..., tuple[Path, int]]


@pytest.fixture
def parquet_dir(tmp_path: Path) -> MakeParquetDir:
    """Factory: a directory of Parquet files with the given row counts; returns (dir, rows).

    Ids run 0..rows-1 across the files in name order.
    """

    def make(
        sizes: Sequence[int] = (250, 1000, 0, 333, 17),
        *,
        row_group_size: int = 100,
        name: str = "data",
    ) -> tuple[Path, int]:
        root = tmp_path / name
        start = 0
        for i, size in enumerate(sizes):
            write_parquet(
                root / f"part-{i:03d}.parquet",
                np.arange(start, start + size),
                row_group_size=row_group_size,
            )
            start += size
        return root, start

    return make


def first_error(loader: Any) -> BaseException:
    """Iterate until the loader raises; return the error.

    The frames of a worker error re-raised by the DataLoader hold its iterator in a reference
    cycle; left to the garbage collector, the iterator's shutdown cannot reach the workers and
    waits out a 5 s join per worker. Clearing the frames frees it at once.
    """
    try:
        for _ in loader:
            pass
    except Exception as exc:
        traceback.clear_frames(exc.__traceback__)
        return exc
    pytest.fail("the loader read the source without an error")


class QuickBatches:
    """Which Parquet row groups were decoded in a first block's quick batches
    (`Format.quick_start`), in this process; `never()` turns quick batches off."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        from torch_dataloader_utils.formats.parquet import format as parquet_format
        from torch_dataloader_utils.formats.parquet import row_groups

        self._monkeypatch, self._row_groups = monkeypatch, row_groups
        self.taken: list[bool] = []

        def recorded(rows: int, quick: int, lo: int, hi: int) -> int:
            made = row_groups.quick_rows(rows, quick, lo, hi)
            self.taken.append(made < rows)
            return made

        monkeypatch.setattr(parquet_format, "quick_rows", recorded)

    def never(self) -> None:
        """No block is quick from here on; forget what was taken."""
        self._monkeypatch.setattr(self._row_groups, "QUICK_BLOCKS", 0)
        self.taken.clear()


@pytest.fixture
def quick_batches(monkeypatch: pytest.MonkeyPatch) -> QuickBatches:
    return QuickBatches(monkeypatch)
