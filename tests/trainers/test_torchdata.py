"""torchdata's ``StatefulDataLoader(dataset, batch_size=None)``, as torchtitan/torchtune wire it.

The dataset is ``Stateful``: the loader's state holds each worker's stream position and its
epoch, so a resume seeks (no replay, no "naively fast-forwarding" warning) and a resumed run
that never calls ``set_epoch`` still reads the rest of the saved epoch, then the next one.
"""

from __future__ import annotations

import logging
from collections import Counter
from typing import Any

import pytest
from torchdata.stateful_dataloader import StatefulDataLoader

import torch_dataloader_utils as tdu
from tests.trainers.conftest import run_example

pytestmark = [
    pytest.mark.slow,
    pytest.mark.timeout(240),
    pytest.mark.filterwarnings("ignore:This DataLoader will create:UserWarning"),
    pytest.mark.filterwarnings("ignore:'set_vital' is deprecated:UserWarning"),
]

SIZES = (300, 250, 450)
ROWS = sum(SIZES)
BATCH = 32


def _dataset(root: str) -> tdu.StructuredDataset:
    return tdu.StructuredDataset(root, "parquet", batch_size=BATCH, shuffle=True, columns=["id"])


def _loader(dataset: tdu.StructuredDataset, workers: int, **kw: Any) -> StatefulDataLoader:
    if workers:
        kw.setdefault("multiprocessing_context", "fork")
    return StatefulDataLoader(dataset, batch_size=None, num_workers=workers, **kw)


def _ids(batches: list[Any]) -> list[int]:
    return [i for b in batches for i in b["id"].tolist()]


@pytest.mark.parametrize(
    ("workers", "options"),
    # (spawned workers persistent: spawned once, not each epoch: ~3.5 s a worker)
    [(0, {}), (2, {}), (2, {"persistent_workers": True}), (2, {"mp": "spawn"})],
    ids=["in-process", "2-workers", "2-persistent", "2-spawn"],
)
def test_resume_seeks_and_keeps_the_epoch(
    parquet_dir: Any, caplog: pytest.LogCaptureFixture, workers: int, options: dict[str, Any]
) -> None:
    root, _ = parquet_dir(SIZES)
    if options.pop("mp", None) == "spawn":
        options.update(multiprocessing_context="spawn", persistent_workers=True)
    loader = _loader(_dataset(str(root)), workers, **options)
    epoch0 = list(loader)
    first = list(loader)  # no set_epoch: the next epoch, in a new order
    assert Counter(_ids(epoch0)) == Counter(_ids(first)) == Counter(range(ROWS))
    assert _ids(epoch0) != _ids(first)

    # Stop 7 batches into the third pass and save the state.
    taken, it = [], iter(loader)
    for _ in range(7):
        taken.append(next(it))
    state = loader.state_dict()
    rest_uninterrupted = list(it)
    assert Counter(_ids(taken + rest_uninterrupted)) == Counter(range(ROWS))

    # A new job: a fresh dataset and loader, no set_epoch.
    resumed = _loader(_dataset(str(root)), workers, **options)
    resumed.load_state_dict(state)
    with caplog.at_level(logging.WARNING):
        rest = list(resumed)
    assert "fast-forwarding" not in caplog.text
    assert _ids(rest) == _ids(rest_uninterrupted)  # exactly the batches that followed
    following = list(resumed)  # then the epoch after it, whole
    assert Counter(_ids(following)) == Counter(range(ROWS))
    assert _ids(following) not in (_ids(epoch0), _ids(first), _ids(taken + rest))


def test_another_number_of_workers_is_refused_clearly(parquet_dir: Any) -> None:
    root, _ = parquet_dir(SIZES)
    loader = _loader(_dataset(str(root)), 2)
    it = iter(loader)
    for _ in range(5):
        next(it)
    state = loader.state_dict()
    del it
    resumed = _loader(_dataset(str(root)), 3)
    resumed.load_state_dict(state)
    with pytest.raises(Exception, match="saved with 1 ranks x 2 DataLoader workers"):
        list(resumed)


def test_in_process_state_resumes_a_tdu_loader_with_workers(parquet_dir: Any) -> None:
    """The main process's state is a loader state: it resumes elastically, on 2 workers."""
    root, _ = parquet_dir(SIZES)
    loader = _loader(_dataset(str(root)), 0)
    it = iter(loader)
    taken = [next(it) for _ in range(9)]
    state = loader.state_dict()["dataset_state"]
    resumed = tdu.create_dataloader(
        str(root), batch_size=BATCH, shuffle=True, columns=["id"], num_workers=2
    )
    resumed.load_state_dict(state)
    assert Counter(_ids(taken) + _ids(list(resumed))) == Counter(range(ROWS))


def test_torchdata_example_resumes_exactly(tmp_path: Any) -> None:
    output = run_example("train_torchdata.py", "--data", str(tmp_path / "data"))
    assert "every row read once in each epoch, across the resume" in output


@pytest.mark.parametrize("workers", [0, 2])
def test_a_mixture_resumes_exactly_under_stateful_dataloader(
    parquet_dir: Any, tmp_path: Any, workers: int
) -> None:
    from tests.conftest import write_parquet

    root, _ = parquet_dir(SIZES)
    small = tmp_path / "small"
    write_parquet(small / "a.parquet", list(range(10_000, 10_090)), row_group_size=20)

    def dataset() -> tdu.MixtureDataset:
        return tdu.MixtureDataset(
            [
                tdu.Source(str(root), weight=2, columns=["id"]),
                tdu.Source(str(small), weight=1, columns=["id"]),
            ],
            epoch_rows=600,  # the small source (90 rows) repeats; the other is subsampled
            batch_size=BATCH,
            shuffle=True,
        )

    loader = _loader(dataset(), workers)
    epoch0 = _ids(list(loader))
    assert len(epoch0) == 600 and sum(i >= 10_000 for i in epoch0) == 200
    taken, it = [], iter(loader)  # the second epoch, stopped after 5 batches
    for _ in range(5):
        taken.append(next(it))
    state = loader.state_dict()
    rest_uninterrupted = list(it)
    epoch1 = _ids(taken + rest_uninterrupted)
    assert len(epoch1) == 600 and sum(i >= 10_000 for i in epoch1) == 200
    # Source 0 (1,000 rows, 400 an epoch) goes on where epoch 0 stopped: no row twice yet.
    assert not set(i for i in epoch0 if i < 10_000) & set(i for i in epoch1 if i < 10_000)

    resumed = _loader(dataset(), workers)
    resumed.load_state_dict(state)
    assert _ids(list(resumed)) == _ids(rest_uninterrupted)
