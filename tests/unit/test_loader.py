"""TabularDataLoader: bundling only in its own iterators, nested lists finished once.

Workers are real (forked) processes, so every test has a timeout.
"""

from __future__ import annotations

import functools
import os
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.utils.data import DataLoader

import torch_dataloader_utils as tdu
from torch_dataloader_utils.transport import Bundle, PackedBundle, bundle_rows

pytestmark = [
    pytest.mark.timeout(60),
    pytest.mark.filterwarnings("ignore:This DataLoader will create:UserWarning"),
]

SIZES = (250, 1000, 0, 333, 17)
ROWS = sum(SIZES)
BATCH = 64


@pytest.fixture
def source(parquet_dir: Any) -> Path:
    root, rows = parquet_dir(SIZES)
    assert rows == ROWS
    return root


def make_loader(root: Path, **options: Any) -> tdu.TabularDataLoader:
    options.setdefault("batch_size", BATCH)
    options.setdefault("num_workers", 2)
    options.setdefault("multiprocessing_context", "fork")
    options.setdefault("timeout", 30)  # a stuck worker raises instead of hanging the run
    return tdu.create_dataloader(root, format="parquet", **options)


def _record_bundling(directory: str, worker_id: int) -> None:
    """A user ``worker_init_fn``: leaves a marker naming its process, id and bundle rows."""
    Path(directory, f"{os.getpid()}-{worker_id}-{bundle_rows()}").touch()


def marks(directory: Path) -> list[tuple[int, int]]:
    """(worker id, bundle rows) of every marker, sorted; removes the markers."""
    out = []
    for p in directory.iterdir():
        _, worker, rows = p.name.split("-")
        out.append((int(worker), int(rows)))
        p.unlink()
    return sorted(out)


def plain_ids(batches: list[Any]) -> list[int]:
    """The ids of plain dict batches (a bundle of any kind fails the test)."""
    ids = []
    for batch in batches:
        assert not isinstance(batch, PackedBundle | Bundle), type(batch)
        assert isinstance(batch, dict), type(batch)
        assert isinstance(batch["id"], torch.Tensor)
        ids.extend(batch["id"].tolist())
    return ids


# --- a DataLoader rebuilt from the loader's public attributes --------------------------------


@pytest.mark.parametrize("with_init", [True, False])
def test_a_dataloader_rebuilt_from_the_attributes_yields_plain_batches(
    source: Path, tmp_path: Path, with_init: bool
) -> None:
    directory = tmp_path / "marks"
    directory.mkdir()
    user = functools.partial(_record_bundling, str(directory)) if with_init else None
    loader = make_loader(source, shuffle=True, worker_init_fn=user)
    assert loader.worker_init_fn is user  # the public attribute stays the user's
    # The loader itself bundles in its workers...
    assert Counter(plain_ids(list(loader))) == Counter(range(ROWS))
    if with_init:
        assert marks(directory) == [
            (0, tdu.loader.DEFAULT_BUNDLE_ROWS),
            (1, tdu.loader.DEFAULT_BUNDLE_ROWS),
        ]
    assert loader.worker_init_fn is user
    # ...a DataLoader rebuilt from its attributes (as accelerate's prepare() does) does not.
    rebuilt = DataLoader(
        loader.dataset,
        batch_size=None,
        collate_fn=loader.collate_fn,
        worker_init_fn=loader.worker_init_fn,
        num_workers=2,
        multiprocessing_context="fork",
        timeout=30,
    )
    batches = list(rebuilt)
    assert Counter(plain_ids(batches)) == Counter(range(ROWS))
    if with_init:
        assert marks(directory) == [(0, 0), (1, 0)]
    # and the loader still bundles afterwards
    assert Counter(plain_ids(list(loader))) == Counter(range(ROWS))
    if with_init:
        assert [rows for _, rows in marks(directory)] == [tdu.loader.DEFAULT_BUNDLE_ROWS] * 2


def test_bundle_rows_zero_gives_the_same_batches_per_worker(source: Path) -> None:
    bundled = [b["id"].tolist() for b in make_loader(source, shuffle=True)]
    plain = [b["id"].tolist() for b in make_loader(source, shuffle=True, bundle_rows=0)]
    assert sorted(bundled) == sorted(plain)  # the same batches, interleaved differently
    assert Counter(i for b in bundled for i in b) == Counter(range(ROWS))


@pytest.mark.parametrize("with_init", [True, False])
def test_persistent_workers_read_two_epochs(source: Path, tmp_path: Path, with_init: bool) -> None:
    directory = tmp_path / "marks"
    directory.mkdir()
    user = functools.partial(_record_bundling, str(directory)) if with_init else None
    loader = make_loader(source, shuffle=True, persistent_workers=True, worker_init_fn=user)
    orders = []
    for epoch in range(2):
        loader.set_epoch(epoch)
        ids = plain_ids(list(loader))
        assert Counter(ids) == Counter(range(ROWS)), epoch
        orders.append(ids)
    assert orders[0] != orders[1]  # the persistent workers saw the new epoch
    assert loader.worker_init_fn is user
    if with_init:  # two workers, started once, bundling
        assert marks(directory) == [
            (0, tdu.loader.DEFAULT_BUNDLE_ROWS),
            (1, tdu.loader.DEFAULT_BUNDLE_ROWS),
        ]


# --- list_format="nested": nested tensors are built once, after the hop ----------------------


def _check_finished(batch: dict[str, Any]) -> dict[str, Any]:
    """A user ``collate_fn`` (runs in the worker): it receives finished nested batches."""
    assert batch["tokens"].is_nested, "collate_fn got an unfinished nested batch"
    assert "tokens_offsets" not in batch
    batch["collated"] = torch.ones(len(batch["id"]), dtype=torch.int8)
    return batch


def expected_tokens(i: int) -> list[int]:
    """make_table's tokens of row ``i``."""
    return [i + k for k in range(i % 5)]


@pytest.mark.parametrize("collate", [False, True], ids=["no-collate", "collate"])
@pytest.mark.parametrize("rows", [0, tdu.loader.DEFAULT_BUNDLE_ROWS], ids=["unbundled", "bundled"])
def test_nested_lists_cross_from_workers(source: Path, rows: int, collate: bool) -> None:
    loader = make_loader(
        source,
        shuffle=True,
        list_format="nested",
        columns=["id", "tokens"],
        bundle_rows=rows,
        collate_fn=_check_finished if collate else None,
    )
    seen = []
    for batch in loader:
        assert "tokens_offsets" not in batch
        tokens = batch["tokens"]
        assert isinstance(tokens, torch.Tensor) and tokens.is_nested
        ids = batch["id"].tolist()
        assert [row.tolist() for row in tokens.unbind()] == [expected_tokens(i) for i in ids]
        assert ("collated" in batch) == collate
        seen.extend(ids)
    assert Counter(seen) == Counter(range(ROWS))
