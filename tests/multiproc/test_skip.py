"""`loader.skip`: batches numbered from an epoch's start are not delivered on any rank, every
rank still yields as many batches as the others (and as len() says), no other row is lost or
repeated, and the skip is part of the state: a resumed run skips them too."""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import torch_dataloader_utils as tdu
from tests.trainers.conftest import run_example

pytestmark = [
    pytest.mark.timeout(300),
    pytest.mark.filterwarnings("ignore:This DataLoader will create:UserWarning"),
]


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("skip")
    for f in range(3):
        ids = np.arange(80) + 80 * f
        pq.write_table(pa.table({"id": ids}), root / f"part-{f}.parquet", row_group_size=11)
    return root


def make(root: Path, **options: Any) -> Any:
    return tdu.create_dataloader(str(root), batch_size=6, shuffle=True, **options)


def batches_of(loader: Any, epoch: int) -> list[list[int]]:
    loader.set_epoch(epoch)
    return [b["id"].tolist() for b in loader]


@pytest.mark.parametrize(("world_size", "workers"), [(1, 0), (2, 2), (3, 0)])
def test_skipped_batches_are_not_delivered_and_ranks_stay_equal(
    data: Path, world_size: int, workers: int
) -> None:
    counts = []
    for rank in range(world_size):
        every = batches_of(make(data, rank=rank, world_size=world_size, num_workers=workers), 1)
        loader = make(data, rank=rank, world_size=world_size, num_workers=workers)
        loader.skip(epoch=1, batches=range(2, 5))
        loader.skip(epoch=1, batches=range(4, 6))  # (overlapping ranges merge)
        loader.set_epoch(1)
        assert len(loader) == len(every) - 4
        got = batches_of(loader, 1)
        assert got == every[:2] + every[6:]  # the others, as they were, in order
        counts.append(len(got))
        assert batches_of(loader, 2) == batches_of(
            make(data, rank=rank, world_size=world_size, num_workers=workers), 2
        )  # another epoch: nothing skipped
    assert len(set(counts)) == 1


@pytest.mark.parametrize("workers", [0, 2])
def test_a_resumed_run_skips_them_too(data: Path, workers: int) -> None:
    every = batches_of(make(data, num_workers=workers), 0)
    loader = make(data, num_workers=workers)
    loader.skip(epoch=0, batches=range(6, 9))
    loader.set_epoch(0)
    first = [b["id"].tolist() for b in itertools.islice(loader, 4)]
    state = loader.state_dict()
    resumed = make(data, num_workers=workers)
    resumed.load_state_dict(state)
    rest = [b["id"].tolist() for b in resumed]
    assert first + rest == every[:6] + every[9:]
    # ... and past the skipped range too
    loader = make(data, num_workers=workers)
    loader.skip(epoch=0, batches=range(1, 3))
    loader.set_epoch(0)
    first = [b["id"].tolist() for b in itertools.islice(loader, 3)]
    resumed = make(data, num_workers=workers)
    resumed.load_state_dict(loader.state_dict())
    assert first + [b["id"].tolist() for b in resumed] == every[:1] + every[3:]


@pytest.mark.parametrize(
    ("before", "after"), [((1, 2), (2, 0)), ((2, 0), (1, 3)), ((1, 0), (3, 2))]
)
def test_skips_not_reached_cross_to_another_topology_as_their_rows(
    data: Path, before: tuple[int, int], after: tuple[int, int]
) -> None:
    (ranks, workers), (new_ranks, new_workers) = before, after
    seen: list[int] = []
    skipped: set[int] = set()
    state = None
    for rank in range(ranks):
        loader = make(data, rank=rank, world_size=ranks, num_workers=workers)
        loader.skip(epoch=0, batches=range(5, 8))
        loader.skip(epoch=0, batches=range(1, 2))  # (one already passed)
        skipped |= {i for b in (1, 5, 6, 7) for i in loader.rows_at(b, epoch=0)["id"].to_pylist()}
        loader.set_epoch(0)
        seen += [i for b in itertools.islice(loader, 3) for i in b["id"].tolist()]
        if rank == 0:
            state = loader.state_dict()
    assert state is not None and not skipped & set(seen)
    counts = []
    for rank in range(new_ranks):
        loader = make(data, rank=rank, world_size=new_ranks, num_workers=new_workers)
        loader.load_state_dict(state)
        got = [i for b in loader for i in b["id"].tolist()]
        counts.append(len(got))
        seen += got
    assert not skipped & set(seen)  # the skipped batches' rows, never
    assert len(seen) == len(set(seen))  # no row twice
    assert len(set(range(240)) - skipped - set(seen)) < ranks + new_ranks  # ("drop")
    # ... and a state of the new leg carries them on (a second elastic resume)
    again = make(data, num_workers=1)
    loader = make(data, rank=0, world_size=new_ranks, num_workers=new_workers)
    loader.load_state_dict(state)
    next(iter(loader))
    again.load_state_dict(loader.state_dict())
    assert not skipped & {i for b in again for i in b["id"].tolist()}


@pytest.mark.parametrize("mixing", ["random", "stratified"])
@pytest.mark.parametrize(("before", "after"), [((1, 2), (2, 0)), ((2, 0), (3, 2))])
def test_a_mixtures_skips_cross_to_another_topology_as_their_rows(
    data: Path, tmp_path: Path, mixing: str, before: tuple[int, int], after: tuple[int, int]
) -> None:
    other = tmp_path / "other"
    other.mkdir()
    pq.write_table(pa.table({"id": np.arange(10_000, 10_150)}), other / "o.parquet")

    def mixture(rank: int, world_size: int, workers: int) -> Any:
        sources = [tdu.Source(str(data)), tdu.Source(str(other))]
        return tdu.create_dataloader(
            sources,
            batch_size=6,
            shuffle=True,
            mixing=mixing,
            rank=rank,
            world_size=world_size,
            num_workers=workers,
        )

    (ranks, workers), (new_ranks, new_workers) = before, after
    seen: list[int] = []
    skipped: set[int] = set()
    state = None
    for rank in range(ranks):
        loader = mixture(rank, ranks, workers)
        loader.skip(epoch=0, batches=range(4, 7))
        skipped |= {i for b in (4, 5, 6) for i in loader.rows_at(b, epoch=0)["id"].to_pylist()}
        loader.set_epoch(0)
        seen += [i for b in itertools.islice(loader, 3) for i in b["id"].tolist()]
        if rank == 0:
            state = loader.state_dict()
    assert state is not None and len(skipped) == 3 * 6 * ranks and not skipped & set(seen)
    for rank in range(new_ranks):
        loader = mixture(rank, new_ranks, new_workers)
        loader.load_state_dict(state)
        seen += [i for b in loader for i in b["id"].tolist()]
    assert not skipped & set(seen)  # the skipped batches' rows, never
    assert len(seen) == len(set(seen))  # no row twice
    every = set(range(240)) | set(range(10_000, 10_150))
    assert len(every - skipped - set(seen)) < ranks + new_ranks  # ("drop")


@pytest.mark.parametrize(
    ("batches", "message"),
    [(range(5, 5), "not empty"), (range(0, 1000), "inside it"), (range(0, 6, 2), "a range")],
)
def test_bad_skips_are_refused_at_the_call(data: Path, batches: range, message: str) -> None:
    with pytest.raises(tdu.InvalidArgumentError, match=message):
        make(data).skip(epoch=0, batches=batches)


def test_the_example_looks_up_a_spike_skips_it_and_resumes() -> None:
    output = run_example("inspect_and_skip.py")
    assert "loss spikes at steps" in output and "the" in output.splitlines()[-1]
    assert "'id': 1234" in output and "'id': 3001" in output and "'id': 1235" in output
    assert "rows once" in output and "skipped rows never" in output


@pytest.mark.parametrize("workers", [0, 2])
def test_rows_at_numbers_batches_as_skip_does(data: Path, workers: int) -> None:
    loader = make(data, num_workers=workers, rank=1, world_size=2)
    loader.skip(epoch=2, batches=range(3, 6))
    loader.set_epoch(2)
    got = [b["id"].tolist() for b in loader]
    kept = [b for b in range(len(got) + 3) if not 3 <= b < 6]
    assert got == [loader.rows_at(b, epoch=2)["id"].to_pylist() for b in kept]


@pytest.mark.parametrize("workers", [0, 2])
def test_a_skip_of_batches_already_delivered_is_refused(data: Path, workers: int) -> None:
    every = batches_of(make(data, num_workers=workers), 0)
    loader = make(data, num_workers=workers)
    loader.set_epoch(0)
    batches = iter(loader)
    got = [next(batches)["id"].tolist() for _ in range(3)]
    with pytest.raises(tdu.InvalidArgumentError, match="delivered already"):
        loader.skip(epoch=0, batches=range(2, 5))
    assert len(loader) == len(every)  # (nothing counted out)
    loader.skip(epoch=0, batches=range(4, 6))  # later ones: skipped in this pass already
    assert len(loader) == len(every) - 2
    got += [b["id"].tolist() for b in batches]
    assert got == every[:4] + every[6:]
    # ... and those before a loaded state's position (delivered by the run that saved it)
    loader = make(data, num_workers=workers)
    loader.set_epoch(0)
    first = [b["id"].tolist() for b in itertools.islice(loader, 5)]
    resumed = make(data, num_workers=workers)
    resumed.load_state_dict(loader.state_dict())
    with pytest.raises(tdu.InvalidArgumentError, match="at batch 5"):
        resumed.skip(epoch=0, batches=range(4, 7))
    resumed.skip(epoch=0, batches=range(5, 7))
    assert first + [b["id"].tolist() for b in resumed] == every[:5] + every[7:]


def test_skips_after_an_elastic_resume_number_the_epochs_batches(data: Path) -> None:
    """Saved with 2 workers after 4 batches, resumed with none: batch 4 is the first the new
    loader delivers, as `rows_at` numbers it."""
    loader = make(data, num_workers=2)
    loader.set_epoch(0)
    first = [b["id"].tolist() for b in itertools.islice(loader, 4)]
    resumed = make(data, num_workers=0)
    resumed.load_state_dict(loader.state_dict())
    expected = [resumed.rows_at(b, epoch=0)["id"].to_pylist() for b in range(len(resumed))]
    assert expected[:4] == first
    with pytest.raises(tdu.InvalidArgumentError, match="at batch 4"):
        resumed.skip(epoch=0, batches=range(3, 6))
    resumed.skip(epoch=0, batches=range(5, 7))
    assert len(resumed) == len(expected) - 2
    rest = [b["id"].tolist() for b in resumed]
    assert rest == expected[4:5] + expected[7:]
    assert set(i for b in first + rest for i in b).isdisjoint(i for b in expected[5:7] for i in b)
