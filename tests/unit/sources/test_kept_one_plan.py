"""A plan made partly from facts kept in ``cache_dir`` is the plan one process makes afresh,
for data with fixed-size lists and maps at depth: the kept facts crossed pickle (which renames
their children), the facts of a rewritten file did not. A state saved by either loader resumes
in the other, every row once (real files, no mocks)."""

from __future__ import annotations

import os
import time
from collections import Counter
from itertools import islice
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

import torch_dataloader_utils as tdu
from tests.nested_data import check_batch, write_nested

SIZES = (40, 33, 27)  # row groups of 16: chunks of 16, 16, 8, 16, 16, 1, 16, 11
BATCH, STOP = 7, 6


def _loader(data: Path, cache: Path | None) -> tdu.TabularDataLoader:
    return tdu.create_dataloader(
        str(data),
        batch_size=BATCH,
        shuffle=True,
        shuffle_seed=3,
        cache_dir=None if cache is None else str(cache),
    )


def _read(loader: tdu.TabularDataLoader, stop: int | None = None) -> list[int]:
    """The ids of the first ``stop`` batches (all: None), each batch's values checked."""
    return [i for batch in islice(loader, stop) for i in check_batch(batch)]


def _rewrite(path: Path) -> None:
    """The same rows, a later modification time: a new identity, so its facts are read again
    while the other files' come from ``cache_dir``."""
    pq.write_table(pq.read_table(path), path, row_group_size=16)
    later = time.time() + 10
    os.utime(path, (later, later))


@pytest.mark.parametrize("nullable_child", [True, False], ids=["nullable", "not-null-child"])
@pytest.mark.parametrize("saved_by", ["kept facts", "fresh"])
def test_a_plan_from_kept_facts_is_the_fresh_plan_and_states_cross(
    tmp_path: Path, nullable_child: bool, saved_by: str
) -> None:
    data, cache = tmp_path / "data", tmp_path / "cache"
    rows = write_nested(data, SIZES, nullable_child=nullable_child)
    _loader(data, cache)  # plans and keeps every file's facts
    _rewrite(data / "part-01.parquet")
    loaders = {"kept facts": _loader(data, cache), "fresh": _loader(data, None)}
    plans = {path: loader.dataset.plan for path, loader in loaders.items()}
    assert len({p.fingerprint for p in plans.values()}) == 1
    assert len({p.schema.to_string() for p in plans.values()}) == 1
    saver = loaders[saved_by]
    before = _read(saver, STOP)
    state: dict[str, Any] = saver.state_dict()
    resumer = loaders["fresh" if saved_by == "kept facts" else "kept facts"]
    resumer.load_state_dict(state)
    after = _read(resumer)
    assert Counter(before + after) == Counter(range(rows))  # every row of epoch 0 exactly once
    assert len(before) == STOP * BATCH
