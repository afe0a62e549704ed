"""Mixtures read for real: Parquet and JSON Lines sources, DataLoader workers (fork and spawn),
ranks, epochs, exact and elastic resume. Every test checks the multiset of ids; each source's
ids have their own range, so the ids say which source a row came from."""

from __future__ import annotations

import json
import pickle
from collections import Counter
from itertools import islice
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import torch_dataloader_utils as tdu
from tests.conftest import write_parquet

pytestmark = [
    pytest.mark.timeout(180),
    pytest.mark.filterwarnings("ignore:This DataLoader will create:UserWarning"),
]

A_ROWS, B_ROWS, B_FIRST = 1000, 300, 100_000
BATCH = 40


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("mixture")
    a = root / "a"
    start = 0
    for i, (rows, group) in enumerate(((400, 64), (350, 100), (250, 30))):
        write_parquet(a / f"part-{i}.parquet", np.arange(start, start + rows), row_group_size=group)
        start += rows
    b = root / "b"
    b.mkdir()
    for i, ids in enumerate(np.array_split(np.arange(B_FIRST, B_FIRST + B_ROWS), 3)):
        lines = [json.dumps({"id": int(x), "x": float(x)}) for x in ids]
        (b / f"part-{i}.jsonl").write_text("\n".join(lines) + "\n")
    return a, b


def sources(data: tuple[Path, Path], **b_options: Any) -> list[tdu.Source]:
    a, b = data
    return [
        tdu.Source(str(a), weight=3, columns=["id", "x"]),
        tdu.Source(str(b), format="json", weight=1, **b_options),
    ]


def make_loader(data: tuple[Path, Path], **options: Any) -> tdu.TabularDataLoader:
    options = {
        "batch_size": BATCH,
        "shuffle": True,
        "shuffle_seed": 3,
        "epoch_rows": 800,
        **options,
    }
    if options.get("num_workers"):
        options.setdefault("multiprocessing_context", "fork")
        options.setdefault("timeout", 60)
    else:
        options.setdefault("num_workers", 0)
    return tdu.create_dataloader(sources(data), **options)


def ids(batches: list[dict[str, Any]]) -> list[int]:
    return [i for batch in batches for i in batch["id"].tolist()]


def of_a(values: list[int]) -> list[int]:
    return [i for i in values if i < B_FIRST]


@pytest.mark.parametrize(
    ("mixing", "workers", "context"),
    [
        ("random", 0, None),
        ("random", 2, "fork"),
        ("stratified", 0, None),
        ("stratified", 2, "fork"),
        # Spawned workers once (~19 s): they get the mixture pickled, whatever the mixing.
        pytest.param("stratified", 2, "spawn", marks=pytest.mark.slow),
    ],
)
def test_each_epoch_holds_each_quota_and_rows_come_once_before_twice(
    data: tuple[Path, Path], workers: int, context: str | None, mixing: str
) -> None:
    options: dict[str, Any] = {"num_workers": workers, "mixing": mixing, "source_column": "source"}
    if context:
        options["multiprocessing_context"] = context
    loader = make_loader(data, **options)
    assert loader.dataset.quotas == (600, 200)
    assert len(loader) == 800 // BATCH
    seen: Counter = Counter()
    for epoch in range(4):
        loader.set_epoch(epoch)
        batches = list(loader)
        assert len(batches) == len(loader)
        got = ids(batches)
        assert len(got) == 800
        for batch in batches:  # the source column says where each row came from
            source = batch["source"].tolist()
            assert source == [0 if i < B_FIRST else 1 for i in batch["id"].tolist()]
            if mixing == "stratified":
                assert abs(source.count(1) - BATCH / 4) < 2
        a = of_a(got)
        assert len(a) == 600 and len(got) - len(a) == 200
        seen.update(got)
        # After e epochs source a delivered 600 e rows of 1,000: every row floor or ceil times.
        for count, rows, first in ((600, A_ROWS, 0), (200, B_ROWS, B_FIRST)):
            total = (epoch + 1) * count
            low, extra = divmod(total, rows)
            counts = Counter(seen[i] for i in range(first, first + rows))
            assert counts == Counter({low + 1: extra, low: rows - extra} if extra else {low: rows})


def test_without_weights_every_row_of_every_source_once(data: tuple[Path, Path]) -> None:
    a, b = data
    loader = tdu.create_dataloader(
        [tdu.Source(str(a), columns=["id", "x"]), tdu.Source(str(b), format="json")],
        batch_size=BATCH,
        shuffle=True,
        num_workers=2,
        multiprocessing_context="fork",
        timeout=60,
    )
    expected = Counter([*range(A_ROWS), *range(B_FIRST, B_FIRST + B_ROWS)])
    for epoch in range(2):
        loader.set_epoch(epoch)
        assert Counter(ids(list(loader))) == expected


def test_ranks_get_equal_batches_and_together_the_whole_epoch(data: tuple[Path, Path]) -> None:
    whole = Counter(ids(list(make_loader(data))))
    got: Counter = Counter()
    lengths = []
    for rank in range(4):
        loader = make_loader(data, rank=rank, world_size=4, num_workers=2)
        batches = list(loader)
        lengths.append(len(batches))
        got.update(ids(batches))
    assert len(set(lengths)) == 1 and lengths[0] == len(loader)
    assert got == whole and sum(got.values()) == 800


@pytest.mark.parametrize("workers", [0, 2])
def test_a_saved_state_resumes_exactly(data: tuple[Path, Path], workers: int) -> None:
    full = [b["id"].tolist() for b in make_loader(data, num_workers=workers)]
    first = make_loader(data, num_workers=workers)
    head = [b["id"].tolist() for b in islice(first, 7)]
    state = pickle.loads(pickle.dumps(first.state_dict()))
    resumed = make_loader(data, num_workers=workers)
    resumed.load_state_dict(state)
    rest = [b["id"].tolist() for b in resumed]
    assert head + rest == full


def test_elastic_resume_on_other_ranks_and_workers_reads_the_rest_once(
    data: tuple[Path, Path],
) -> None:
    whole = Counter(ids(list(make_loader(data, remainder="uneven"))))
    got: Counter = Counter()
    states = []
    for rank in range(2):  # 2 ranks x 2 workers read 3 batches each, then stop
        loader = make_loader(data, rank=rank, world_size=2, num_workers=2, remainder="uneven")
        got.update(ids(list(islice(loader, 3))))
        states.append(pickle.loads(pickle.dumps(loader.state_dict())))
    for rank in range(3):  # 3 ranks x 1 worker go on
        loader = make_loader(data, rank=rank, world_size=3, num_workers=0, remainder="uneven")
        loader.load_state_dict(states[0])
        got.update(ids(list(loader)))
    assert got == whole


def test_sources_must_agree_on_columns(data: tuple[Path, Path]) -> None:
    a, b = data
    with pytest.raises(tdu.SchemaMismatchError, match="lacks"):
        tdu.create_dataloader(
            [tdu.Source(str(a), columns=["id"]), tdu.Source(str(b), format="json")],
            num_workers=0,
        )


def test_a_source_reads_files_or_a_table() -> None:
    with pytest.raises(tdu.InvalidArgumentError, match="either path"):
        tdu.Source()
    with pytest.raises(tdu.InvalidArgumentError, match="weight"):
        tdu.Source("x/", weight=-1)


def test_a_format_for_every_source_is_refused(data: tuple[Path, Path]) -> None:
    with pytest.raises(tdu.InvalidArgumentError, match="its own format"):
        tdu.create_dataloader(sources(data), format="json", num_workers=0)


def test_options_of_one_source_are_refused_for_the_mixture(data: tuple[Path, Path]) -> None:
    with pytest.raises(tdu.InvalidArgumentError, match="split_strategy"):
        tdu.create_dataloader(sources(data), split_strategy="round_robin", num_workers=0)
