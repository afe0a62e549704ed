"""The epoch rule: a pass after one that delivered a batch reads the next epoch; set_epoch wins.

Also: trainers reach the dataset through ``loader.sampler.set_epoch``; a loader rebuilt from
its attributes (as Lightning does) reads the same rows; a copy pickled in a process with no
rank resolves its rank where it lands; malformed states are refused clearly.
"""

from __future__ import annotations

import pickle
from collections import Counter
from typing import Any

import pytest
from torch.utils.data import DataLoader

import torch_dataloader_utils as tdu
from torch_dataloader_utils.errors import InvalidArgumentError, StateMismatchError

SIZES = (120, 200, 80)
ROWS = sum(SIZES)


def _ids(loader: Any) -> list[int]:
    return [i for batch in loader for i in batch["id"].tolist()]


@pytest.fixture
def loader(parquet_dir: Any) -> tdu.TabularDataLoader:
    root, _ = parquet_dir(SIZES)
    return tdu.create_dataloader(str(root), batch_size=16, shuffle=True, num_workers=0)


def test_each_pass_without_set_epoch_reads_the_next_epoch(loader: Any) -> None:
    passes = [_ids(loader) for _ in range(3)]
    assert all(Counter(p) == Counter(range(ROWS)) for p in passes)
    assert len({tuple(p) for p in passes}) == 3
    assert loader.dataset.epoch == 2
    for epoch, expected in enumerate(passes):
        loader.set_epoch(epoch)  # an explicit epoch wins and reproduces the order
        assert _ids(loader) == expected


def test_set_epoch_the_same_epoch_repeats_it(loader: Any) -> None:
    loader.set_epoch(4)
    first = _ids(loader)
    loader.set_epoch(4)
    assert _ids(loader) == first


def test_a_pass_that_delivered_nothing_does_not_advance(loader: Any) -> None:
    iter(loader)  # begun, abandoned before its first batch
    first = _ids(loader)
    loader.set_epoch(0)
    assert _ids(loader) == first


def test_a_broken_off_pass_advances(loader: Any) -> None:
    next(iter(loader))
    second = _ids(loader)
    loader.set_epoch(1)
    assert _ids(loader) == second


def test_sampler_set_epoch_reaches_the_dataset(loader: Any) -> None:
    loader.sampler.set_epoch(3)  # what Lightning calls
    assert loader.dataset.epoch == 3
    assert next(iter(loader.sampler)) is None  # an iterable dataset's sampler


def test_plain_dataloader_workers_advance_on_their_own(loader: Any) -> None:
    plain = DataLoader(
        loader.dataset, batch_size=None, num_workers=2, multiprocessing_context="fork"
    )
    passes = [_ids(plain) for _ in range(2)]
    assert all(Counter(p) == Counter(range(ROWS)) for p in passes)
    assert passes[0] != passes[1]


def test_loaded_complete_epoch_goes_on_with_the_next(loader: Any) -> None:
    _ids(loader)
    state = loader.state_dict()
    assert state["complete"] and state["epoch"] == 0
    loader.set_epoch(1)
    second = _ids(loader)
    loader.load_state_dict(state)
    assert _ids(loader) == second  # no set_epoch: epoch 1
    loader.load_state_dict(state)
    loader.set_epoch(0)  # the saved epoch asked explicitly: its (empty) rest
    assert _ids(loader) == []


@pytest.mark.parametrize("change", ["missing", "extra-layout-key", "not-a-number"])
def test_malformed_state_is_refused(loader: Any, change: str) -> None:
    state = loader.state_dict()
    if change == "missing":
        del state["legs"]
    elif change == "extra-layout-key":
        state["layout"]["colour"] = "red"
    else:
        state["topology"]["world_size"] = "two"
    with pytest.raises(StateMismatchError, match="malformed loader state"):
        loader.load_state_dict(state)


def test_rebuilt_from_attributes_reads_the_same_rows(loader: Any) -> None:
    loader.set_epoch(2)
    expected = _ids(loader)
    rebuilt = tdu.TabularDataLoader(
        loader.dataset,
        batch_size=None,
        sampler=None,
        batch_sampler=None,
        collate_fn=loader.collate_fn,
        num_workers=loader.num_workers,
    )
    rebuilt.set_epoch(2)
    assert _ids(rebuilt) == expected


def test_rebuilding_with_a_batch_size_is_refused(loader: Any) -> None:
    with pytest.raises(InvalidArgumentError, match="batch_size=8"):
        tdu.TabularDataLoader(loader.dataset, batch_size=8)


def test_pickled_without_a_rank_resolves_where_it_lands(
    loader: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    copy = pickle.loads(pickle.dumps(loader.dataset))  # a parent with no rank
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    assert copy.resolved_rank() == (1, 2)
    frozen = pickle.loads(pickle.dumps(copy))  # a rank pickling for its spawned workers
    monkeypatch.delenv("RANK")
    monkeypatch.delenv("WORLD_SIZE")
    assert frozen.resolved_rank() == (1, 2)
    assert copy.resolved_rank() == (0, 1)


@pytest.mark.parametrize("workers", [0, 1])
def test_a_resumed_pass_is_followed_by_the_next_epoch(parquet_dir: Any, workers: int) -> None:
    root, _ = parquet_dir(SIZES)
    loader = tdu.create_dataloader(str(root), batch_size=16, shuffle=True, num_workers=workers)
    it = iter(loader)
    taken = [next(it)["id"].tolist() for _ in range(5)]
    state = loader.state_dict()
    del it
    loader.load_state_dict(state)
    rest = _ids(loader)
    assert Counter(rest + [i for b in taken for i in b]) == Counter(range(ROWS))
    following = _ids(loader)
    assert loader.dataset.epoch == 1
    assert Counter(following) == Counter(range(ROWS))
