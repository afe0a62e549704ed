"""HF Accelerate on CPU under torchrun: ``accelerator.prepare(loader)`` keeps every rank on its
own share, ``save_state``/``load_state`` resume the loader, and gradient accumulation sees the
last batch of each epoch.

``Accelerator(cpu=True)`` is what makes accelerate see torchrun's ranks on CPU (SERVICES.md).
Two launches of ``scripts/accelerate_run.py``: one with the default ``DataLoaderConfiguration``
saves its state in the middle of epoch 2 and reads on; the other, with ``dispatch_batches=False``
and ``use_stateful_dataloader=True``, loads that state in a new job. Both over rows and over
packed sequences (every token once: accelerate keeps the packed batches as they are).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

import torch_dataloader_utils as tdu
from tests.distributed.conftest import (
    BATCH,
    PACKED_BATCH,
    PACKING,
    ROWS,
    PackedData,
    assert_exactly_once,
    ids_of,
    run_script,
)
from tests.distributed.scripts.ranks import ids, packing_of

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


@dataclass(frozen=True)
class Runs:
    """The two launches over one kind of data: ``rows`` ids (tokens when ``packing``)."""

    results: dict[str, Ranks]
    data: Path
    rows: int
    options: dict[str, Any]  # create_dataloader's, besides the shared ones

    def __getitem__(self, mode: str) -> Ranks:
        return self.results[mode]


@pytest.fixture(scope="module", params=["rows", "packed"])
def runs(
    request: pytest.FixtureRequest, dataset_dir: Path, packed_dataset: PackedData, work_dir: Path
) -> Runs:
    if request.param == "packed":
        data, rows = packed_dataset.root, packed_dataset.tokens
        options = {"batch_size": PACKED_BATCH, "packing": PACKING}
    else:
        data, rows, options = dataset_dir, ROWS, {"batch_size": BATCH}
    results: dict[str, Ranks] = {}
    for mode in MODES:  # in this order: "load" resumes what "save" saved
        spec = {
            "mode": mode,
            "data": str(data),
            "out": str(work_dir / f"accelerate-{request.param}-{mode}.json"),
            "checkpoint": str(work_dir / f"checkpoint-{request.param}"),
            "k": K,
            **options,
        }
        results[mode], _ = run_script("accelerate_run.py", RANKS, spec)
    return Runs(results, data, rows, options)


@pytest.mark.parametrize("mode", MODES)
def test_prepare_returns_the_loader_and_accelerate_sees_every_rank(runs: Runs, mode: str) -> None:
    for rank, result in enumerate(runs[mode]):
        assert result["unchanged"]
        assert result["num_processes"] == RANKS
        assert result["process_index"] == result["dist_rank"] == rank
        assert result["distributed_type"].endswith("MULTI_CPU")


@pytest.mark.parametrize("mode", MODES)
def test_every_id_exactly_once_per_epoch_with_equal_batches(runs: Runs, mode: str) -> None:
    for epoch in range(2):
        per_rank = [result["epochs"][epoch] for result in runs[mode]]
        every = ids_of(batch for batches in per_rank for batch in batches)
        assert_exactly_once(every, range(runs.rows), missing=runs.rows % RANKS)
        assert len({len(batches) for batches in per_rank}) == 1


def test_each_rank_reads_its_own_share(runs: Runs) -> None:
    """What a rank reads through prepare() is what the loader of that rank reads alone."""
    options = dict(runs.options)
    options["packing"] = packing_of(options.get("packing"))
    for rank in range(RANKS):
        alone = tdu.create_dataloader(
            str(runs.data),
            **options,
            shuffle=True,
            num_workers=2,
            multiprocessing_context="fork",
            timeout=60,
            rank=rank,
            world_size=RANKS,
        )
        for epoch in range(2):
            alone.set_epoch(epoch)
            expected = ids(alone)
            for mode in MODES:
                assert runs[mode][rank]["epochs"][epoch] == expected, (mode, rank, epoch)


def test_load_state_in_a_new_job_continues_where_save_state_was(runs: Runs) -> None:
    saved, loaded = runs["save"], runs["load"]
    for old, new in zip(saved, loaded, strict=True):
        assert len(old["before"]) == K
        assert new["rest"] == old["rest"]
    every = ids_of(b for result in saved for b in (*result["before"], *result["rest"]))
    assert_exactly_once(every, range(runs.rows), missing=runs.rows % RANKS)
    assert len({len(result["rest"]) for result in loaded}) == 1


def test_gradient_accumulation_syncs_at_the_last_batch_of_each_epoch(
    runs: Runs,
) -> None:
    for result in runs["load"]:
        for flags in result["sync"]:
            n = len(flags)
            assert n % ACCUMULATE != 0  # the last window is short: only the loader can tell
            expected = [(i + 1) % ACCUMULATE == 0 or i == n - 1 for i in range(n)]
            assert flags == expected
