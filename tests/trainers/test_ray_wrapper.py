"""Ray Train's default wrapper (``prepare_data_loader(loader)``, ``move_to_device=True``) holds
one batch ahead of its user: a state taken through it, or through the loader it wraps, counts
only the batches the user received, at every stop of an epoch, and packed batches (dicts whose
``cu_seqlens`` differ in length, ``max_seqlen`` an int) pass its move whole (the whole Ray run
is in ``test_ray.py``; here the wrapper class Ray returns, without starting Ray)."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from ray.train.torch.train_loop_utils import _WrappedDataLoader

import torch_dataloader_utils as tdu
from tests.packed_data import Where, tokens_of, write_documents

ROWS, BATCH = 240, 10
SEQ_LEN = 16

pytestmark = pytest.mark.timeout(300)


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("ray-wrapper")
    pq.write_table(pa.table({"id": np.arange(ROWS)}), root / "a.parquet", row_group_size=40)
    return root


@pytest.fixture(scope="module")
def documents(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Where]:
    """Token documents (ids unique) for packed sequences: about 4,000 tokens."""
    root = tmp_path_factory.mktemp("ray-wrapper-packed")
    return root, write_documents(root, 2, 140)


def wrapped(
    data: Path, workers: int, **options: Any
) -> tuple[tdu.TabularDataLoader, _WrappedDataLoader]:
    options.setdefault("batch_size", BATCH)
    loader = tdu.create_dataloader(
        str(data),
        shuffle=True,
        num_workers=workers,
        multiprocessing_context="fork" if workers else None,
        **options,
    )
    return loader, _WrappedDataLoader(loader, torch.device("cpu"), False)


@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("through", ["wrapper", "loader"])
@pytest.mark.parametrize("stop", [0, 1, 7, ROWS // BATCH - 1, ROWS // BATCH])
def test_a_state_taken_under_the_wrapper_resumes_exactly(
    data: Path, workers: int, through: str, stop: int
) -> None:
    loader, wrapper = wrapped(data, workers)
    seen: Counter[int] = Counter()
    batches = iter(wrapper)
    for _ in range(stop):
        seen.update(next(batches)["id"].tolist())
    state = (wrapper if through == "wrapper" else loader).state_dict()
    assert state["batches"] == stop
    assert state["complete"] == (stop == ROWS // BATCH)
    again, rewrapped = wrapped(data, workers)
    rewrapped.load_state_dict(state)
    epoch = list(rewrapped) if stop < ROWS // BATCH else []
    for batch in epoch:
        seen.update(batch["id"].tolist())
    assert seen == Counter(range(ROWS))  # every row of epoch 0 exactly once
    assert again.dataset.epoch == 0 or stop == ROWS // BATCH


def test_set_epoch_through_the_wrapper_reaches_the_loader(data: Path) -> None:
    loader, wrapper = wrapped(data, 0)
    wrapper.set_epoch(3)
    assert loader.dataset.epoch == 3
    assert sorted(i for b in wrapper for i in b["id"].tolist()) == list(range(ROWS))


@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("stop", [0, 1, 7, -1, None])  # (-1: the last but one; None: all)
def test_packed_batches_pass_the_wrapper_whole_and_a_state_under_it_resumes_exactly(
    documents: tuple[Path, Where], workers: int, stop: int | None
) -> None:
    root, where = documents
    packing = tdu.Packing("tokens", seq_len=SEQ_LEN, pad_value=-1)
    options = {"packing": packing, "batch_size": 3}
    loader, wrapper = wrapped(root, workers, **options)
    total = len(loader)
    stop = total if stop is None else stop % total
    seen: Counter[int] = Counter()
    batches = iter(wrapper)
    for _ in range(stop):
        batch = next(batches)
        assert isinstance(batch["max_seqlen"], int)  # left as it is by Ray's move
        seen.update(tokens_of(batch, where, seq_len=SEQ_LEN, batch_size=3))
    state = wrapper.state_dict()
    assert state["batches"] == stop and state["complete"] == (stop == total)
    _, rewrapped = wrapped(root, workers, **options)
    rewrapped.load_state_dict(state)
    for batch in rewrapped if stop < total else []:
        seen.update(tokens_of(batch, where, seq_len=SEQ_LEN, batch_size=3))
    assert seen == Counter(set(where))  # every token of epoch 0 exactly once
