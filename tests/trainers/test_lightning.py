"""PyTorch Lightning runs ``examples/train_lightning.py`` for real: 2 CPU processes with gloo.

Lightning owns the epoch loop: it never calls ``loader.set_epoch``, only
``loader.sampler.set_epoch``; with ``ddp_spawn`` it pickles a loader built in the parent into
the ranks; it saves the loader's state in its checkpoints and rebuilds the loader from its
attributes for ``predict``. Every case reads every row once per epoch, a new order each epoch,
equal batches per rank; fit (the plain run the resumed runs are compared with, batch for
batch), resume and predict also over packed sequences (``--packed``: every token once).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.trainers.conftest import epoch_report, merge, read_ranks, run_example

pytestmark = [pytest.mark.slow, pytest.mark.timeout(400)]

ROWS = 4_000  # the example's generated data
BATCH = 64
BATCHES = ROWS // 2 // BATCH + 1  # per rank and epoch: 2,000 rows, the last batch short


@dataclass(frozen=True)
class Data:
    """What a run reads: ``rows`` ids (tokens when packed), ``missing`` of them left out by
    "drop" each epoch, ``BATCHES`` batches per rank and epoch; ``options`` choose it."""

    rows: int
    missing: int
    options: tuple[str, ...]


ROWS_DATA = Data(ROWS, 0, ())
# --packed: 3,017 tokens in documents of 0-29, sequences of 16, 3 a batch: each rank's 1,508
# tokens are 31 whole batches and one of 20 tokens (the second sequence padded), 1 left out.
PACKED = Data(3_017, 1, ("--packed", "--batch-size", "3"))
DATA = pytest.mark.parametrize("data", [ROWS_DATA, PACKED], ids=["rows", "packed"])


def _options(tmp_path: Path, *more: str) -> list[str]:
    return [
        "--data",
        str(tmp_path / "data"),
        "--checkpoints",
        str(tmp_path / "ckpt"),
        "--out",
        str(tmp_path / "out"),
        "--batch-size",
        str(BATCH),
        *more,
    ]


def _assert_exactly_once_and_reshuffled(report: dict, epochs: int, data: Data = ROWS_DATA) -> None:
    assert sorted(report) == list(range(epochs))
    for epoch in report.values():
        assert (epoch.seen, epoch.duplicated, epoch.missing) == (
            data.rows - data.missing,
            0,
            data.missing,
        )
        assert epoch.batches == (BATCHES, BATCHES)
    assert len({epoch.first for epoch in report.values()}) == epochs  # a new order each epoch


@pytest.mark.parametrize(
    ("options", "epochs", "data"),
    [
        (["--set-epoch"], 2, ROWS_DATA),
        (["--strategy", "ddp_spawn"], 2, ROWS_DATA),
    ],
    ids=["ddp-user-set-epoch", "ddp_spawn-loader-built-in-parent"],
)
def test_fit_reads_every_row_once_per_epoch_in_a_new_order(
    tmp_path: Path, options: list[str], epochs: int, data: Data
) -> None:
    more = ["--epochs", str(epochs), *options, *data.options]
    run_example("train_lightning.py", *_options(tmp_path, *more))
    report = epoch_report(read_ranks(tmp_path / "out", "run"), data.rows)
    _assert_exactly_once_and_reshuffled(report, epochs, data)


@DATA
def test_fit_resumes_exactly_mid_epoch_and_from_the_last_step_of_an_epoch(
    tmp_path: Path, data: Data
) -> None:
    # One plain run of 3 epochs (Lightning's own loop, never set_epoch: every row once per
    # epoch, a new order each) saves every 4 steps: step 20 is mid-epoch, BATCHES ends epoch 0.
    every = ["--save-every", "4", *data.options]
    run_example("train_lightning.py", *_options(tmp_path, "--epochs", "3", *every, "--tag", "a"))
    whole = read_ranks(tmp_path / "out", "a")
    _assert_exactly_once_and_reshuffled(epoch_report(whole, data.rows), 3, data)
    first = {rank: [r for r in records if r["epoch"] == 0] for rank, records in whole.items()}
    middle, end = (tmp_path / "ckpt" / f"step={step}.ckpt" for step in (20, BATCHES))
    assert middle.is_file() and end.is_file()

    # From step 20: the rest of epoch 0, then epoch 1, as if steps 20 on had never been read.
    resume = [*data.options, "--resume"]
    run_example("train_lightning.py", *_options(tmp_path, *resume, str(middle), "--tag", "b"))
    before = {  # what the checkpoint covered: steps 0-19 of epoch 0
        rank: [r for r in records if r["step"] < 20] for rank, records in first.items()
    }
    assert all(len(records) == 20 for records in before.values())
    second = read_ranks(tmp_path / "out", "b")
    assert all(r["step"] >= 20 for records in second.values() for r in records)
    report = epoch_report(merge(before, second), data.rows)
    _assert_exactly_once_and_reshuffled(report, 2, data)
    # Exactly: the resumed run's batches are the plain run's, step for step.
    assert _batches(second) == _batches(whole, below_epoch=2, from_step=20)

    # From the epoch's last step: the checkpoint holds a complete epoch, so epoch 1 is read.
    run_example("train_lightning.py", *_options(tmp_path, *resume, str(end), "--tag", "c"))
    third = read_ranks(tmp_path / "out", "c")
    assert {r["epoch"] for records in third.values() for r in records} == {1}
    _assert_exactly_once_and_reshuffled(epoch_report(merge(first, third), data.rows), 2, data)
    assert _batches(third) == _batches(whole, below_epoch=2, from_step=BATCHES)


def _batches(
    ranks: dict[int, list[dict]], *, below_epoch: int = 10**9, from_step: int = 0
) -> dict[int, list[tuple[int, int, list[int]]]]:
    """Per rank, its batches' (epoch, step, ids) from global step ``from_step`` on, in epochs
    below ``below_epoch``."""
    return {
        rank: [
            (r["epoch"], r["step"], r["ids"])
            for r in records
            if r["epoch"] < below_epoch and r["step"] >= from_step
        ]
        for rank, records in ranks.items()
    }


@DATA
def test_predict_rebuilds_the_loader_and_reads_every_row_once(tmp_path: Path, data: Data) -> None:
    predict = ["--predict", "--tag", "predict", *data.options]
    run_example("train_lightning.py", *_options(tmp_path, *predict))
    report = epoch_report(read_ranks(tmp_path / "out", "predict"), data.rows)
    epoch = report[0]
    assert (epoch.seen, epoch.duplicated, epoch.missing) == (
        data.rows - data.missing,
        0,
        data.missing,
    )
    assert epoch.batches == (BATCHES, BATCHES)


def _assert_mixed_by_source(ranks: dict[int, list[dict]]) -> None:
    # The first two files (ids below ROWS / 2) are source 0: every row is labelled with its
    # source, and each full batch holds half of each (stratified, equal weights: ±1 row).
    for records in ranks.values():
        for record in records:
            assert record["sources"] == [int(i >= ROWS // 2) for i in record["ids"]]
            if len(record["ids"]) == BATCH:
                assert abs(sum(record["sources"]) - BATCH // 2) <= 1


def test_a_mixture_fits_and_resumes_from_a_mid_epoch_checkpoint_exactly(tmp_path: Path) -> None:
    mixture = ["--mixture", "--epochs", "2"]
    run_example(
        "train_lightning.py", *_options(tmp_path, *mixture, "--max-steps", "25", "--tag", "first")
    )
    checkpoint = tmp_path / "ckpt" / "step=20.ckpt"
    assert checkpoint.is_file()
    run_example("train_lightning.py", *_options(tmp_path, *mixture, "--resume", str(checkpoint)))
    first = read_ranks(tmp_path / "out", "first")
    before = {rank: [r for r in records if r["step"] < 20] for rank, records in first.items()}
    second = read_ranks(tmp_path / "out", "run")
    _assert_mixed_by_source(first)
    _assert_mixed_by_source(second)
    report = epoch_report(merge(before, second), ROWS)
    _assert_exactly_once_and_reshuffled(report, 2)
