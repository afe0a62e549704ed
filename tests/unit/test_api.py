"""The public API: the earlier library's contract (seeds/004) and the curated top level.

A script written for torch-dataloader-utils 0.2 (``StructuredDataset.create_dataloader(path=...,
format=..., num_workers=..., batch_size=..., columns=..., filters=..., shuffle=...)`` returning
``(loader, dataset)``, then ``dataset.set_epoch(epoch)`` each epoch) must run unchanged.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.compute as pc
import pytest
import torch
from torch.utils.data import DataLoader

import torch_dataloader_utils as tdu

pytestmark = pytest.mark.timeout(60)

SIZES = (250, 1000, 0, 333, 17)
ROWS = sum(SIZES)


@pytest.fixture
def source(parquet_dir: Any) -> Path:
    root, rows = parquet_dir(SIZES)
    assert rows == ROWS
    return root


def test_seed_quick_start_runs_unchanged(source: Path) -> None:
    from torch_dataloader_utils import StructuredDataset

    loader, dataset = StructuredDataset.create_dataloader(
        path=str(source),
        format="parquet",
        num_workers=0,
        batch_size=128,
        columns=["x", "label", "id"],
        filters=pc.field("x") > 100.0,
        shuffle=True,
    )
    assert isinstance(loader, DataLoader)
    assert isinstance(dataset, StructuredDataset)
    assert loader.dataset is dataset
    expected = Counter(i for i in range(ROWS) if i * 0.5 > 100.0)
    orders = []
    for epoch in range(3):
        dataset.set_epoch(epoch)
        order = []
        for batch in loader:
            assert set(batch) == {"x", "label", "id"}
            assert isinstance(batch["x"], torch.Tensor) and isinstance(batch["label"], torch.Tensor)
            assert len(batch["id"]) <= 128
            np.testing.assert_array_equal(batch["label"].numpy(), batch["id"].numpy() % 7)
            order.extend(batch["id"].tolist())
        assert Counter(order) == expected
        orders.append(order)
    assert orders[0] != orders[1] != orders[2] != orders[0]  # set_epoch reshuffles


@pytest.mark.parametrize("output_format", ["torch", "numpy", "arrow", "dict"])
def test_seed_output_formats(source: Path, output_format: str) -> None:
    loader, dataset = tdu.StructuredDataset.create_dataloader(
        path=source, format="parquet", num_workers=0, batch_size=100, output_format=output_format
    )
    dataset.set_epoch(0)
    ids = []
    for batch in loader:
        column = batch.column("id").to_pylist() if output_format == "arrow" else batch["id"]
        ids.extend(int(i) for i in column)
    assert ids == list(range(ROWS))


def test_seed_storage_options_and_file_urls(source: Path) -> None:
    loader, _ = tdu.StructuredDataset.create_dataloader(
        path=f"file://{source}", format="parquet", num_workers=0, storage_options={}
    )
    assert Counter(i for b in loader for i in b["id"].tolist()) == Counter(range(ROWS))


def test_top_level_create_dataloader(source: Path) -> None:
    loader = tdu.create_dataloader(source, format="parquet", num_workers=0, shuffle=True)
    assert isinstance(loader, DataLoader) and isinstance(loader, tdu.TabularDataLoader)
    assert isinstance(loader.dataset, tdu.StructuredDataset)
    loader.set_epoch(1)
    assert loader.dataset.epoch == 1
    assert Counter(i for b in loader for i in b["id"].tolist()) == Counter(range(ROWS))


def test_top_level_create_dataloader_accepts_the_earlier_path_keyword(source: Path) -> None:
    loader = tdu.create_dataloader(path=str(source), num_workers=0)
    assert Counter(i for b in loader for i in b["id"].tolist()) == Counter(range(ROWS))
    with pytest.raises(tdu.InvalidArgumentError, match="exactly once"):
        tdu.create_dataloader(str(source), path=str(source), num_workers=0)
    with pytest.raises(tdu.InvalidArgumentError, match="exactly once"):
        tdu.create_dataloader(num_workers=0)


@pytest.mark.filterwarnings("ignore:This DataLoader will create:UserWarning")
def test_top_level_defaults_use_workers(source: Path) -> None:
    loader = tdu.create_dataloader(source, format="parquet", batch_size=100)
    assert loader.num_workers == min(4, os.cpu_count() or 1)
    assert loader.batch_size is None  # the dataset batches, in Arrow
    assert Counter(i for b in loader for i in b["id"].tolist()) == Counter(range(ROWS))


def test_all_is_unique_and_complete() -> None:
    # (Sorted: the package refuses to import otherwise.)
    assert len(set(tdu.__all__)) == len(tdu.__all__)
    for name in tdu.__all__:
        assert hasattr(tdu, name), name
    for name in ("StructuredDataset", "create_dataloader", "TabularDataLoader"):
        assert name in tdu.__all__


def test_module_runs_as_a_command() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "torch_dataloader_utils", "--help"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert "usage" in result.stdout.lower()


def test_the_earlier_names_of_the_moved_datasets_still_import() -> None:
    # In a fresh interpreter: the table layer's package is imported first, as a user's
    # `from torch_dataloader_utils.iceberg import IcebergDataset` does.
    code = (
        "from torch_dataloader_utils.iceberg import IcebergDataset\n"
        "import torch_dataloader_utils as tdu\n"
        "from torch_dataloader_utils.dataset import MixtureDataset\n"
        "assert IcebergDataset is tdu.IcebergDataset and MixtureDataset is tdu.MixtureDataset\n"
        "assert IcebergDataset.__module__ == 'torch_dataloader_utils.dataset.iceberg'\n"
    )
    done = subprocess.run([sys.executable, "-c", code], check=False, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
