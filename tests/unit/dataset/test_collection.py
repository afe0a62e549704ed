"""`dataset.collection.paused_collection`: planning runs without the cyclic collector, which is
on again after (or stays off, where the user turned it off)."""

from __future__ import annotations

import gc
import traceback
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import torch_dataloader_utils as tdu
from torch_dataloader_utils.dataset.collection import paused_collection


@pytest.fixture
def collector_on() -> Iterator[None]:
    was_on = gc.isenabled()
    gc.enable()
    yield
    if not was_on:
        gc.disable()


@pytest.mark.usefixtures("collector_on")
def test_off_inside_and_on_again_after_even_on_an_error() -> None:
    with paused_collection():
        assert not gc.isenabled()
    assert gc.isenabled()
    with pytest.raises(ValueError, match="planning failed"), paused_collection():
        raise ValueError("planning failed")
    assert gc.isenabled()


@pytest.mark.usefixtures("collector_on")
def test_a_collector_the_user_turned_off_stays_off() -> None:
    gc.disable()
    with paused_collection():
        pass
    assert not gc.isenabled()


@pytest.mark.usefixtures("collector_on")
def test_planning_many_files_runs_no_collection_and_reads_every_row(tmp_path: Path) -> None:
    """300 files make more than enough objects to start the collector (700 allocations):
    it does not run while planning (it may once after, for what planning left), and the
    loader reads every row once."""
    for i in range(300):
        ids = np.arange(i * 10, i * 10 + 10)
        pq.write_table(pa.table({"id": ids}), tmp_path / f"part-{i:03d}.parquet")
    runs: list[bool] = []  # each collection: whether it ran inside planning

    def counted(phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            runs.append(any(f.name == "_build" for f in traceback.extract_stack()))

    gc.collect()
    gc.callbacks.append(counted)
    try:
        loader = tdu.create_dataloader(str(tmp_path), batch_size=64, shuffle=True)
    finally:
        gc.callbacks.remove(counted)
    assert runs and not any(runs) and gc.isenabled()
    ids = Counter(i for batch in loader for i in batch["id"].tolist())
    assert ids == Counter(range(3000))
