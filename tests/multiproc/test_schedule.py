"""`weights_schedule`: a mixture's weights change at a step on every rank; each batch holds its
phase's shares (stratified: within two rows), each source goes on in its own order across
phases and epochs (no row twice before all its rows), a resumed run (same topology, or another
at an epoch's start) continues exactly, and `rows_at` agrees with what was delivered."""

from __future__ import annotations

import itertools
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import torch_dataloader_utils as tdu
from torch_dataloader_utils.errors import InvalidArgumentError

pytestmark = [
    pytest.mark.timeout(300),
    pytest.mark.filterwarnings("ignore:This DataLoader will create:UserWarning"),
]

SCHEDULE = [(0, [3, 1]), (5, [1, 1]), (13, [0, 1])]
ROWS = {"web": 400, "code": 200}


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    out = {}
    for s, (name, rows) in enumerate(ROWS.items()):
        root = tmp_path_factory.mktemp(name)
        for f in range(2):
            ids = np.arange(rows // 2) + rows // 2 * f + 10_000 * s
            pq.write_table(pa.table({"id": ids}), root / f"part-{f}.parquet", row_group_size=23)
        out[name] = root
    return out


def make(data: dict[str, Path], **options: Any) -> Any:
    sources = [tdu.Source(str(data["web"])), tdu.Source(str(data["code"]))]
    options = {"num_workers": 0, **options}
    return tdu.create_dataloader(
        sources,
        epoch_rows=240,
        batch_size=8,
        shuffle=True,
        mixing="stratified",
        weights_schedule=SCHEDULE,
        **options,
    )


def epoch_batches(loader: Any, epoch: int) -> list[list[int]]:
    loader.set_epoch(epoch)
    return [b["id"].tolist() for b in loader]


def phase(step: int) -> np.ndarray:
    weights = [w for s, w in SCHEDULE if s <= step][-1]
    return np.asarray(weights, float) / sum(weights)


@pytest.mark.parametrize(
    ("world_size", "workers", "context"),
    [
        (1, 0, None),
        (2, 2, "fork"),
        (3, 3, "fork"),
        (4, 1, "fork"),
        (2, 2, "spawn"),
        (1, 3, "spawn"),
    ],
)
def test_each_step_holds_its_phases_shares_and_sources_go_on(
    data: dict[str, Path], world_size: int, workers: int, context: str | None
) -> None:
    seen: Counter[int] = Counter()
    for epoch in range(3):
        per_rank = []
        for rank in range(world_size):
            loader = make(
                data,
                rank=rank,
                world_size=world_size,
                num_workers=workers,
                **({"multiprocessing_context": context} if context else {}),
            )
            got = epoch_batches(loader, epoch)
            assert len(got) == len(loader)
            per_rank.append(got)
            steps = len(got)
            for b, ids in enumerate(got):
                counts = np.bincount([i // 10_000 for i in ids], minlength=2)
                share = len(ids) * phase(epoch * steps + b)
                assert np.all(np.abs(counts - share) <= 2), (epoch, rank, b, counts)
                seen.update(ids)
        assert len({len(r) for r in per_rank}) == 1  # every rank as many batches
    for s, rows in enumerate(ROWS.values()):
        mine = {i: n for i, n in seen.items() if i // 10_000 == s}
        # Within one source: all rows once before any twice.
        assert max(mine.values()) - min(mine.values()) <= 1
        assert len(mine) == rows or max(mine.values()) == 1


@pytest.mark.parametrize("workers", [0, 2])
def test_a_resumed_run_continues_exactly(data: dict[str, Path], workers: int) -> None:
    every = epoch_batches(make(data, num_workers=workers), 0)
    loader = make(data, num_workers=workers)
    loader.set_epoch(0)
    first = [b["id"].tolist() for b in itertools.islice(loader, 7)]  # past the change at 5
    resumed = make(data, num_workers=workers)
    resumed.load_state_dict(loader.state_dict())
    assert first + [b["id"].tolist() for b in resumed] == every
    assert resumed.state_dict()["steps"] == [1, 8]


def test_another_world_size_from_an_epochs_start_keeps_the_steps(data: dict[str, Path]) -> None:
    """Saved at 2 ranks after epoch 0; resumed at 3: the schedule's steps still count the
    2-rank run's batches, so every source goes on exactly where the 2-rank run would."""
    two = [make(data, rank=r, world_size=2) for r in range(2)]
    for loader in two:
        epoch_batches(loader, 0)
    state = two[0].state_dict()
    assert state["steps"] == [2, 8]
    reference = Counter(
        i for r in range(2) for b in epoch_batches(make(data, rank=r, world_size=2), 1) for i in b
    )
    three = []
    for rank in range(3):
        loader = make(data, rank=rank, world_size=3)
        loader.load_state_dict(state)
        three.append(epoch_batches(loader, 1))
    got = Counter(i for r in three for b in r for i in b)
    # The same rows of each source (3 ranks drop a different remainder: at most 2 rows).
    assert sum((reference - got).values()) <= 2 and not got - reference


@pytest.mark.parametrize("workers", [0, 2])
def test_rows_at_agrees_with_the_delivered_batches(data: dict[str, Path], workers: int) -> None:
    for rank in range(2):
        loader = make(data, rank=rank, world_size=2, num_workers=workers)
        delivered = epoch_batches(loader, 1)
        for b in [0, 3, 4, 5, 6, len(delivered) - 1]:
            rows = loader.rows_at(batch=b, epoch=1, rank=rank)
            assert rows["id"].to_pylist() == delivered[b]


@pytest.mark.parametrize(
    ("before", "after"), [((1, 0), (2, 2)), ((2, 2), (3, 0)), ((3, 1), (1, 2))]
)
def test_an_elastic_resume_inside_a_change_reads_every_row_once(
    data: dict[str, Path], before: tuple[int, int], after: tuple[int, int]
) -> None:
    """Saved 3 steps in (before the change at step 5) on one topology, the rest of the epoch
    read on another: each source's rows of the epoch, each once, as the uninterrupted run."""
    (ranks, workers), (new_ranks, new_workers) = before, after
    reference: Counter[int] = Counter()
    for rank in range(ranks):
        reference.update(
            i for b in epoch_batches(make(data, rank=rank, world_size=ranks), 0) for i in b
        )
    seen: Counter[int] = Counter()
    state = None
    for rank in range(ranks):
        loader = make(data, rank=rank, world_size=ranks, num_workers=workers)
        loader.set_epoch(0)
        seen.update(i for b in itertools.islice(loader, 3) for i in b["id"].tolist())
        state = state or loader.state_dict()
    for rank in range(new_ranks):
        loader = make(data, rank=rank, world_size=new_ranks, num_workers=new_workers)
        loader.load_state_dict(state)
        got = [b["id"].tolist() for b in loader]
        seen.update(i for b in got for i in b)
        # Each batch holds one phase's shares, but where a change falls inside it (at most
        # one batch a change on this topology).
        shares = [np.asarray(w, float) / sum(w) for _, w in SCHEDULE]
        mixed = 0
        for ids in got:
            counts = np.bincount([i // 10_000 for i in ids], minlength=2)
            mixed += not any(np.all(np.abs(counts - len(ids) * w) <= 2) for w in shares)
        assert mixed <= 2
    assert max(seen.values()) == 1
    # The same rows of each source (another world size drops another remainder: < 3 rows).
    assert sum((reference - seen).values()) < 3 and sum((seen - reference).values()) < 3


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"weights_schedule": [(0, [1, 1, 1])]}, "3 weights for 2 sources"),
        ({"weights_schedule": [(3, [1, 1])]}, "begin at step 0"),
        ({"weights_schedule": [(0, [1, 1]), (0, [2, 1])]}, "increasing"),
    ],
)
def test_bad_schedules_are_refused_at_the_call(
    data: dict[str, Path], options: dict[str, Any], message: str
) -> None:
    sources = [tdu.Source(str(data["web"])), tdu.Source(str(data["code"]))]
    with pytest.raises(InvalidArgumentError, match=message):
        tdu.create_dataloader(sources, batch_size=8, **options)
    weighed = [tdu.Source(str(data["web"]), weight=2), tdu.Source(str(data["code"]))]
    with pytest.raises(InvalidArgumentError, match="leave weight= unset"):
        tdu.create_dataloader(weighed, batch_size=8, weights_schedule=[(0, [1, 1])])
