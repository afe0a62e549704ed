"""DDP ranks under torchrun (gloo, CPU): exactly once per epoch, equal batches, one plan.

One launch per world size reads every configuration (``scripts/read_epochs.py``); the tests
below check its result. Ranks learn their rank from the initialised process group, and every
rank builds the loader, as in a DDP job. The ``packed`` cases read packed sequences of token
documents (ids are tokens, each once in the data; rank 0 alone counts them at planning).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

import torch_dataloader_utils as tdu
from tests.distributed.conftest import (
    BATCH,
    CORRUPT_IDS,
    PACKED_BATCH,
    PACKING,
    ROWS,
    PackedData,
    assert_exactly_once,
    ids_of,
    run_script,
)
from tests.distributed.scripts.ranks import FILTERS, ids, packing_of

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]

EPOCHS = 2
SEED = 3  # the shuffle seed scripts/read_epochs.py uses
READS = ("workers0", "workers2", "workers2-persistent")
PACKED = ("packed-workers0", "packed-workers2")
BALANCED = "packed-balanced"  # packed, Balance(window=4): batches move between ranks
CASES: list[dict[str, Any]] = [
    {"name": "workers0", "num_workers": 0, "epochs": EPOCHS},
    {"name": "workers2", "num_workers": 2, "epochs": EPOCHS},
    {"name": "workers2-persistent", "num_workers": 2, "epochs": EPOCHS, "persistent": True},
    {"name": "filter", "num_workers": 2, "filter": "label<3,id>=100"},
    {"name": "pad", "num_workers": 2, "remainder": "pad"},
]

Ranks = list[dict[str, Any]]  # one case's result: one entry per rank


@dataclass(frozen=True)
class DdpRun:
    world_size: int
    cases: dict[str, Ranks]
    tokens: int  # the packed cases' data

    def rows(self, case: str) -> int:
        """Ids of ``case``'s data: rows, or tokens."""
        return self.tokens if case in PACKED else ROWS


def _batch_rows(case: str) -> int:
    """Ids of a whole batch of ``case``."""
    return PACKED_BATCH * PACKING["seq_len"] if case in PACKED else BATCH


@pytest.fixture(scope="module", params=[2, 3], ids=lambda n: f"{n}ranks")
def ddp_run(
    request: pytest.FixtureRequest,
    dataset_dir: Path,
    csv_dataset_dir: Path,
    corrupt_dataset_dir: Path,
    packed_dataset: PackedData,
    work_dir: Path,
) -> DdpRun:
    world_size = request.param
    out = work_dir / f"ddp-{world_size}.json"
    # CSV column types are inferred on rank 0 alone (no schema= given): the other ranks must
    # read with them. Small blocks give every file several byte-range chunks.
    csv = {"data": str(csv_dataset_dir), "format": "csv", "format_options": {"chunk_bytes": 2048}}
    cases = [{"batch_size": BATCH, **case} for case in CASES]
    cases.append({"batch_size": BATCH, "name": "csv", "num_workers": 2, **csv})
    skip = {"data": str(corrupt_dataset_dir), "on_error": "skip", "epochs": EPOCHS}
    cases.append({"batch_size": BATCH, "name": "skip", "num_workers": 2, **skip})
    packed = {"data": str(packed_dataset.root), "packing": PACKING, "epochs": EPOCHS}
    for name, workers in zip(PACKED, (0, 2), strict=True):
        cases.append({"batch_size": PACKED_BATCH, "name": name, "num_workers": workers, **packed})
    balanced = {**packed, "packing": {**PACKING, "balance": {"window": 4, "linear": 2.0}}}
    cases.append({"batch_size": PACKED_BATCH, "name": BALANCED, "num_workers": 2, **balanced})
    result, _ = run_script(
        "read_epochs.py", world_size, {"data": str(dataset_dir), "out": str(out), "cases": cases}
    )
    return DdpRun(world_size, result, packed_dataset.tokens)


def _epoch(ranks: Ranks, epoch: int) -> list[list[list[int]]]:
    """The batches of ``epoch`` on each rank."""
    return [rank["epochs"][epoch] for rank in ranks]


def _flat(batches: list[list[int]]) -> list[int]:
    return [i for batch in batches for i in batch]


@pytest.mark.parametrize("case", READS + PACKED)
def test_every_id_exactly_once_per_epoch(ddp_run: DdpRun, case: str) -> None:
    world_size, rows = ddp_run.world_size, ddp_run.rows(case)
    for epoch in range(EPOCHS):
        per_rank = _epoch(ddp_run.cases[case], epoch)
        every = ids_of(batch for batches in per_rank for batch in batches)
        # "drop": the last rows % world_size rows (tokens) of the epoch's order are not read.
        assert_exactly_once(every, range(rows), missing=rows % world_size)
        assert [len(_flat(b)) for b in per_rank] == [rows // world_size] * world_size


def test_balanced_packs_every_token_once_with_equal_batches(ddp_run: DdpRun) -> None:
    """Balanced, a rank's batches are other ranks' too: every token still once over the
    ranks, as many batches on each, and the same tokens as the plain packed read."""
    world_size, rows = ddp_run.world_size, ddp_run.tokens
    ranks = ddp_run.cases[BALANCED]
    for epoch in range(EPOCHS):
        per_rank = _epoch(ranks, epoch)
        every = ids_of(batch for batches in per_rank for batch in batches)
        assert_exactly_once(every, range(rows), missing=rows % world_size)
        plain = _epoch(ddp_run.cases["packed-workers2"], epoch)
        assert sorted(every) == sorted(ids_of(b for batches in plain for b in batches))
        assert len({len(batches) for batches in per_rank}) == 1
        assert all(rank["len"] == len(per_rank[0]) for rank in ranks)
        # Some batch moved: a rank holds tokens another rank planned.
        assert any(
            sorted(_flat(a)) != sorted(_flat(b)) for a, b in zip(per_rank, plain, strict=True)
        )


@pytest.mark.parametrize("case", READS + PACKED)
def test_equal_batches_on_every_rank(ddp_run: DdpRun, case: str) -> None:
    ranks = ddp_run.cases[case]
    share = ddp_run.rows(case) // ddp_run.world_size
    for epoch in range(EPOCHS):
        sizes = [[len(b) for b in batches] for batches in _epoch(ranks, epoch)]
        assert all(s == sizes[0] for s in sizes), sizes  # same count, and same sizes, per rank
        assert len(sizes[0]) == ranks[0]["len"] == -(-share // _batch_rows(case))
        assert all(rank["len"] == ranks[0]["len"] for rank in ranks)


@pytest.mark.parametrize("case", READS + PACKED)
def test_epochs_differ_in_order(ddp_run: DdpRun, case: str) -> None:
    ranks = ddp_run.cases[case]
    first, second = ([_flat(b) for b in _epoch(ranks, e)] for e in range(2))
    assert all(a != b for a, b in zip(first, second, strict=True))
    # The chunk order is shuffled too: rows move between ranks from one epoch to the next.
    assert any(set(a) != set(b) for a, b in zip(first, second, strict=True))


def test_a_skipped_chunk_keeps_batches_equal_on_every_rank_and_is_counted(
    ddp_run: DdpRun,
) -> None:
    ranks = ddp_run.cases["skip"]
    lost = set(CORRUPT_IDS)
    for epoch in range(EPOCHS):
        per_rank = _epoch(ranks, epoch)
        sizes = [[len(b) for b in batches] for batches in per_rank]
        assert all(s == sizes[0] for s in sizes), sizes
        assert len(sizes[0]) == ranks[0]["len"]
        every = ids_of(batch for batches in per_rank for batch in batches)
        assert not (set(every) & lost)
        # What is not lost is read once, but for the copies that replace the lost rows.
        missing = len(set(range(ROWS)) - lost - set(every))
        assert missing <= ROWS % ddp_run.world_size  # the "drop" remainder
        assert sum(every.values()) == ROWS - ROWS % ddp_run.world_size
    # Each epoch, the rank that read the row group skipped its rows once, and counted them.
    skipped = [n for rank in ranks for n in rank["failures"]]
    assert sum(skipped) >= EPOCHS * len(lost) - ROWS % ddp_run.world_size * EPOCHS
    assert sum(skipped) <= EPOCHS * len(lost)


@pytest.mark.parametrize("cases", [READS, PACKED], ids=["rows", "packed"])
def test_a_ranks_share_does_not_depend_on_its_workers(
    ddp_run: DdpRun, cases: tuple[str, ...]
) -> None:
    for epoch in range(EPOCHS):
        shares = [[sorted(_flat(b)) for b in _epoch(ddp_run.cases[c], epoch)] for c in cases]
        assert all(share == shares[0] for share in shares)


@pytest.mark.parametrize("case", ["workers0", "packed-workers0"])
def test_ranks_read_what_an_explicit_rank_reads(
    ddp_run: DdpRun, dataset_dir: Path, packed_dataset: PackedData, case: str
) -> None:
    """The broadcast plan (a packed one with its token counts) reads as a plan made locally
    with rank= and world_size= does."""
    world_size = ddp_run.world_size
    ranks = ddp_run.cases[case]
    packed = case in PACKED
    for rank in range(world_size):
        loader = tdu.create_dataloader(
            str(packed_dataset.root if packed else dataset_dir),
            batch_size=PACKED_BATCH if packed else BATCH,
            packing=packing_of(PACKING if packed else None),
            shuffle=True,
            shuffle_seed=SEED,
            num_workers=0,
            rank=rank,
            world_size=world_size,
        )
        for epoch in range(EPOCHS):
            loader.set_epoch(epoch)
            assert ids(loader) == ranks[rank]["epochs"][epoch]


def test_filtered_rows_exactly_once_with_equal_batches(ddp_run: DdpRun, dataset_dir: Path) -> None:
    world_size = ddp_run.world_size
    kept = pq.read_table(dataset_dir, filters=FILTERS["label<3,id>=100"], columns=["id"])
    expected = kept["id"].to_pylist()
    assert 0 < len(expected) < ROWS
    per_rank = _epoch(ddp_run.cases["filter"], 0)
    every = ids_of(batch for batches in per_rank for batch in batches)
    assert_exactly_once(every, expected, missing=len(expected) % world_size)
    counts = [len(batches) for batches in per_rank]
    assert counts == [ddp_run.cases["filter"][0]["len"]] * world_size
    assert [len(_flat(b)) for b in per_rank] == [len(expected) // world_size] * world_size


def test_pad_reads_every_id_and_repeats_fewer_than_world_size(ddp_run: DdpRun) -> None:
    world_size = ddp_run.world_size
    per_rank = _epoch(ddp_run.cases["pad"], 0)
    every = ids_of(batch for batches in per_rank for batch in batches)
    assert set(every) == set(range(ROWS))
    share = -(-ROWS // world_size)
    assert [len(_flat(b)) for b in per_rank] == [share] * world_size
    repeats = sum(every.values()) - ROWS
    assert repeats == share * world_size - ROWS
    assert 0 < repeats < world_size  # 839 rows divide by neither 2 nor 3
    assert max(every.values()) == 2
    assert len({len(batches) for batches in per_rank}) == 1


def test_csv_types_inferred_on_rank_0_read_on_every_rank(ddp_run: DdpRun) -> None:
    world_size = ddp_run.world_size
    per_rank = _epoch(ddp_run.cases["csv"], 0)
    every = ids_of(batch for batches in per_rank for batch in batches)
    assert_exactly_once(every, range(ROWS), missing=ROWS % world_size)
    assert [len(_flat(b)) for b in per_rank] == [ROWS // world_size] * world_size


@pytest.mark.parametrize("case", [*(c["name"] for c in CASES), "csv", *PACKED])
def test_plan_is_made_once_on_rank_0(ddp_run: DdpRun, case: str) -> None:
    ranks = ddp_run.cases[case]
    assert [rank["list_files"] for rank in ranks] == [1] + [0] * (ddp_run.world_size - 1)
    # Counting the filtered rows (or a packed dataset's tokens) reads the data: every rank
    # counts a share of the chunks, once (sources.steps); nothing else counts.
    filtered = 1 if case == "filter" else 0
    assert [rank["count_rows"] for rank in ranks] == [filtered] * len(ranks)
    tokens = 1 if case in PACKED else 0
    assert [rank["count_tokens"] for rank in ranks] == [tokens] * len(ranks)
    assert len({rank["fingerprint"] for rank in ranks}) == 1
