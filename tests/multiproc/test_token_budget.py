"""Token-budget batches read for real: Parquet token lists with a row id, DataLoader workers
(fork and spawn), ranks, epochs, exact resume. Every row id once per epoch, every batch within
its budget (rows x longest row), every rank the same number of batches, known up front."""

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

pytestmark = [
    pytest.mark.timeout(300),
    pytest.mark.filterwarnings("ignore:This DataLoader will create:UserWarning"),
]

BUDGET = 120


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[int, int]]:
    """Three files of 150 rows of 0-39 tokens (some null); returns the folder and each row
    id's length."""
    root = tmp_path_factory.mktemp("budget")
    rng = np.random.default_rng(3)
    lengths: dict[int, int] = {}
    for f in range(3):
        rows: list[list[int] | None] = []
        for i in range(150):
            n = int(rng.integers(0, 40))
            rows.append(None if n == 0 and i % 2 else list(range(n)))
            lengths[f * 150 + i] = n
        table = pa.table(
            {
                "tokens": pa.array(rows, pa.list_(pa.int32())),
                "id": pa.array(range(f * 150, f * 150 + 150), pa.int64()),
            }
        )
        pq.write_table(table, root / f"part-{f}.parquet", row_group_size=40)
    return root, lengths


def make(root: Path, *, max_tokens: int = BUDGET, **options: Any) -> Any:
    options = {"shuffle": True, "null_policy": "fill", **options}
    return tdu.create_dataloader(
        str(root), batching=tdu.TokenBudget("tokens", max_tokens=max_tokens), **options
    )


def ids_of(batch: dict[str, Any], lengths: dict[int, int], max_tokens: int = BUDGET) -> list[int]:
    """The batch's row ids, after checking it keeps to its budget and its rows' lengths."""
    ids = batch["id"].tolist()
    rows, width = batch["tokens"].shape
    assert rows == len(ids) and rows * width <= max_tokens
    assert batch["tokens_lengths"].tolist() == [lengths[i] for i in ids]
    return ids


@pytest.mark.parametrize("world_size", [1, 2, 3, 4])
@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("shuffle", [False, True])
def test_every_row_once_within_its_budget_with_equal_batches(
    data: tuple[Path, dict[int, int]], world_size: int, workers: int, shuffle: bool
) -> None:
    root, lengths = data
    orders = []
    for epoch in (0, 1):
        seen: Counter[int] = Counter()
        batches = []
        order: list[int] = []
        for rank in range(world_size):
            loader = make(
                root, rank=rank, world_size=world_size, num_workers=workers, shuffle=shuffle
            )
            loader.set_epoch(epoch)
            assert len(loader) > 0
            got = [ids_of(b, lengths) for b in loader]
            assert len(got) == len(loader)
            batches.append(len(got))
            for ids in got:
                seen.update(ids)
                order += ids
        assert len(set(batches)) == 1  # equal batches on every rank, as len() said
        assert max(seen.values()) == 1
        assert len(lengths) - len(seen) < world_size  # "drop": fewer than a row per rank
        orders.append(order)
    assert (orders[0] != orders[1]) == shuffle


def test_a_workers_messages_hold_about_bundle_rows_rows(
    data: tuple[Path, dict[int, int]],
) -> None:
    """A worker's message holds about ``bundle_rows`` rows: budget batches hold a few rows
    each (here about 6), and counting them as the planner's groups (96 rows) sent one batch
    a message, each with the main process's cost of a message."""
    from torch_dataloader_utils.transport import buffers

    root, lengths = data
    received = buffers._received
    before = received.carried + received.named
    loader = make(root, num_workers=2, bundle_rows=96)
    batches = [ids_of(b, lengths) for b in loader]
    messages = received.carried + received.named - before
    assert Counter(i for ids in batches for i in ids) == Counter(set(lengths))
    # Each worker's messages ramp up 1, 2, 4 ... batches to its bundle_rows' worth.
    rows_a_message = sum(map(len, batches)) / messages
    assert rows_a_message >= 96 / 4, (messages, len(batches))


def test_spawned_workers_read_every_row_once(data: tuple[Path, dict[int, int]]) -> None:
    root, lengths = data
    loader = make(root, num_workers=2, multiprocessing_context="spawn")
    seen = Counter(i for b in loader for i in ids_of(b, lengths))
    assert seen == Counter(set(lengths))


@pytest.mark.parametrize(("world_size", "workers"), [(1, 0), (1, 2), (2, 0), (3, 2)])
def test_a_resumed_epoch_reads_every_remaining_row_once(
    data: tuple[Path, dict[int, int]], world_size: int, workers: int
) -> None:
    root, lengths = data
    seen: Counter[int] = Counter()
    states = []
    for rank in range(world_size):
        loader = make(root, rank=rank, world_size=world_size, num_workers=workers)
        loader.set_epoch(1)
        for batch in itertools.islice(loader, 7):
            seen.update(ids_of(batch, lengths))
        states.append(loader.state_dict())
    counts = []
    for rank in range(world_size):
        loader = make(root, rank=rank, world_size=world_size, num_workers=workers)
        loader.load_state_dict(states[rank])
        got = [ids_of(b, lengths) for b in loader]
        counts.append(len(got))
        seen.update(i for ids in got for i in ids)
    assert len(set(counts)) == 1
    assert max(seen.values()) == 1 and len(lengths) - len(seen) < world_size


def elastic_resume(
    data: tuple[Path, dict[int, int]],
    before: tuple[int, int],
    after: tuple[int, int],
    **options: Any,
) -> None:
    """Read 5 batches of epoch 1 on ``before``'s (ranks, workers) (stopping inside a group),
    resume rank 0's state on ``after``'s, and check every row is read once."""
    root, lengths = data
    (ranks, workers), (new_ranks, new_workers) = before, after
    seen: Counter[int] = Counter()
    state = None
    for rank in range(ranks):
        loader = make(root, rank=rank, world_size=ranks, num_workers=workers, **options)
        loader.set_epoch(1)
        for batch in itertools.islice(loader, 5):  # (stops inside a group)
            seen.update(ids_of(batch, lengths))
        if rank == 0:
            state = loader.state_dict()
    assert state is not None
    counts = []
    for rank in range(new_ranks):
        loader = make(root, rank=rank, world_size=new_ranks, num_workers=new_workers, **options)
        loader.load_state_dict(state)
        got = [ids_of(b, lengths) for b in loader]
        counts.append(len(got))
        seen.update(i for ids in got for i in ids)
    assert len(set(counts)) == 1  # the rest of the epoch in equal batches on the new ranks
    assert max(seen.values()) == 1  # no row twice
    # "drop": fewer than a row per rank of each leg left out
    assert len(lengths) - len(seen) < ranks + new_ranks


@pytest.mark.parametrize(
    ("before", "after"),
    [((1, 2), (2, 0)), ((2, 2), (1, 0)), ((3, 0), (2, 2)), ((2, 0), (2, 2)), ((4, 1), (1, 3))],
)
@pytest.mark.parametrize("shuffle", [False, True])
def test_an_elastic_resume_reads_every_remaining_row_once(
    data: tuple[Path, dict[int, int]],
    before: tuple[int, int],
    after: tuple[int, int],
    shuffle: bool,
) -> None:
    elastic_resume(data, before, after, shuffle=shuffle)


@pytest.mark.parametrize(("before", "after"), [((2, 0), (3, 0)), ((1, 2), (2, 1))])
def test_an_elastic_resume_with_blocks_smaller_than_a_group_reads_every_row_once(
    data: tuple[Path, dict[int, int]], before: tuple[int, int], after: tuple[int, int]
) -> None:
    # A group's rows then span several blocks: the rest of each block it touched is read.
    options = {"shuffle_block_size": 5, "shuffle": True}
    assert make(data[0], **options).dataset.layout.batch_size > 5  # (a group holds > 5 rows)
    elastic_resume(data, before, after, **options)


def test_a_row_over_the_budget_is_refused_naming_its_file_or_truncated(
    data: tuple[Path, dict[int, int]],
) -> None:
    root, lengths = data
    with pytest.raises(tdu.DataError, match=r"part-\d\.parquet.*longer than TokenBudget"):
        make(root, max_tokens=30)
    loader = tdu.create_dataloader(
        str(root),
        batching=tdu.TokenBudget("tokens", max_tokens=30, overflow="truncate"),
        null_policy="fill",
        num_workers=2,
    )
    seen: Counter[int] = Counter()
    for batch in loader:
        rows, width = batch["tokens"].shape
        assert rows * width <= 30
        ids = batch["id"].tolist()
        assert batch["tokens_lengths"].tolist() == [min(lengths[i], 30) for i in ids]
        seen.update(ids)
    assert seen == Counter(set(lengths))


@pytest.mark.parametrize(
    ("batching", "message"),
    [
        (lambda: tdu.TokenBudget("tokens", max_tokens=0), "max_tokens"),
        (lambda: tdu.TokenBudget("tokens", max_tokens=5, overflow="cut"), "overflow"),
        (lambda: tdu.TokenBudget("id", max_tokens=50), "'id' holds int64, not lists"),
        (lambda: tdu.TokenBudget("nope", max_tokens=50), "'nope' is not a column"),
        (lambda: 7, "batching must be a tdu.TokenBudget"),
    ],
)
def test_bad_budgets_are_refused_clearly(
    data: tuple[Path, dict[int, int]], batching: Any, message: str
) -> None:
    root, _ = data
    with pytest.raises(
        (tdu.InvalidArgumentError, tdu.UnsupportedTypeError, tdu.ColumnNotFoundError), match=message
    ):
        tdu.create_dataloader(str(root), batching=batching())
