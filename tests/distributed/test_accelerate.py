"""HF Accelerate on CPU under torchrun: ``accelerator.prepare(loader)`` keeps every rank on its
own share, ``save_state``/``load_state`` resume the loader, and gradient accumulation sees the
last batch of each epoch.

``Accelerator(cpu=True)`` is what makes accelerate see torchrun's ranks on CPU (SERVICES.md).
Two launches of ``scripts/accelerate_run.py``: one with the default ``DataLoaderConfiguration``
saves its state in the middle of epoch 2 and reads on; the other, with ``dispatch_batches=False``
and ``use_stateful_dataloader=True``, loads that state in a new job.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import torch_dataloader_utils as tdu
from tests.distributed.conftest import BATCH, ROWS, assert_exactly_once, ids_of, run_script

pytestmark = [
    pytest.mark.slow,
    pytest.mark.timeout(240),
    pytest.mark.filterwarnings("ignore:This DataLoader will create:UserWarning"),
]

RANKS = 2
K = 5  # batches of epoch 2 read before save_state
ACCUMULATE = 3  # gradient_accumulation_steps of the "load" run
MODES = ("save", "load")

Ranks = list[dict[str, Any]]


@pytest.fixture(scope="module")
def runs(dataset_dir: Path, work_dir: Path) -> dict[str, Ranks]:
    results: dict[str, Ranks] = {}
    for mode in MODES:  # in this order: "load" resumes what "save" saved
        spec = {
            "mode": mode,
            "data": str(dataset_dir),
            "out": str(work_dir / f"accelerate-{mode}.json"),
            "checkpoint": str(work_dir / "checkpoint"),
            "batch_size": BATCH,
            "k": K,
        }
        results[mode], _ = run_script("accelerate_run.py", RANKS, spec)
    return results


@pytest.mark.parametrize("mode", MODES)
def test_prepare_returns_the_loader_and_accelerate_sees_every_rank(
    runs: dict[str, Ranks], mode: str
) -> None:
    for rank, result in enumerate(runs[mode]):
        assert result["unchanged"]
        assert result["num_processes"] == RANKS
        assert result["process_index"] == result["dist_rank"] == rank
        assert result["distributed_type"].endswith("MULTI_CPU")


@pytest.mark.parametrize("mode", MODES)
def test_every_id_exactly_once_per_epoch_with_equal_batches(
    runs: dict[str, Ranks], mode: str
) -> None:
    for epoch in range(2):
        per_rank = [result["epochs"][epoch] for result in runs[mode]]
        every = ids_of(batch for batches in per_rank for batch in batches)
        assert_exactly_once(every, range(ROWS), missing=ROWS % RANKS)
        assert len({len(batches) for batches in per_rank}) == 1


def test_each_rank_reads_its_own_share(runs: dict[str, Ranks], dataset_dir: Path) -> None:
    """What a rank reads through prepare() is what the loader of that rank reads alone."""
    for rank in range(RANKS):
        alone = tdu.create_dataloader(
            str(dataset_dir),
            batch_size=BATCH,
            shuffle=True,
            num_workers=2,
            multiprocessing_context="fork",
            timeout=60,
            rank=rank,
            world_size=RANKS,
        )
        for epoch in range(2):
            alone.set_epoch(epoch)
            expected = [batch["id"].tolist() for batch in alone]
            for mode in MODES:
                assert runs[mode][rank]["epochs"][epoch] == expected, (mode, rank, epoch)


def test_load_state_in_a_new_job_continues_where_save_state_was(runs: dict[str, Ranks]) -> None:
    saved, loaded = runs["save"], runs["load"]
    for old, new in zip(saved, loaded, strict=True):
        assert len(old["before"]) == K
        assert new["rest"] == old["rest"]
    every = ids_of(b for result in saved for b in (*result["before"], *result["rest"]))
    assert_exactly_once(every, range(ROWS), missing=ROWS % RANKS)
    assert len({len(result["rest"]) for result in loaded}) == 1


def test_gradient_accumulation_syncs_at_the_last_batch_of_each_epoch(
    runs: dict[str, Ranks],
) -> None:
    for result in runs["load"]:
        for flags in result["sync"]:
            n = len(flags)
            assert n % ACCUMULATE != 0  # the last window is short: only the loader can tell
            expected = [(i + 1) % ACCUMULATE == 0 or i == n - 1 for i in range(n)]
            assert flags == expected
