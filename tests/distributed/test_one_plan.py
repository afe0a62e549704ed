"""A state saved in one process resumes under torchrun with 2 ranks (gloo) and back, over
Parquet with fixed-size lists and maps at depth.

Planning spread over ranks gathers each file's facts through pickle, which renames these
types' children, so the plan of 2 ranks once fingerprinted otherwise than one process's and
each refused the other's state. Here one process saves after ``STOP`` batches, 2 ranks resume
it (an elastic resume) and save after ``K`` batches a rank, and one process resumes that:
what was read before and after each save is every row once, less what "drop" leaves out.
"""

from __future__ import annotations

from itertools import islice
from pathlib import Path

import pytest
import torch

import torch_dataloader_utils as tdu
from tests.distributed.conftest import assert_exactly_once, ids_of, run_script
from tests.nested_data import check_batch, write_nested

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]

SIZES = (51, 37, 41)  # 129 rows: 2 ranks leave one out
BATCH, SEED = 8, 11
STOP, K = 5, 3  # batches read before each save: in one process, and per rank


def _loader(data: Path) -> tdu.TabularDataLoader:
    return tdu.create_dataloader(str(data), batch_size=BATCH, shuffle=True, shuffle_seed=SEED)


def _read(loader: tdu.TabularDataLoader, count: int | None = None) -> list[int]:
    return [i for batch in islice(loader, count) for i in check_batch(batch)]


def test_states_cross_between_one_process_and_two_ranks(tmp_path: Path) -> None:
    data = tmp_path / "data"
    rows = write_nested(data, SIZES)
    one = _loader(data)
    first = _read(one, STOP)
    torch.save(one.state_dict(), tmp_path / "one.pt")
    spec = {
        "data": str(data),
        "out": str(tmp_path / "ranks.json"),
        "batch_size": BATCH,
        "seed": SEED,
        "resume": str(tmp_path / "one.pt"),
        "save": str(tmp_path / "ranks.pt"),
        "k": K,
    }
    ranks, _ = run_script("one_plan.py", 2, spec)
    for rank in ranks:
        assert rank["fingerprint"] == one.dataset.plan.fingerprint
        assert rank["schema"] == one.dataset.plan.schema.to_string()
    # One process -> 2 ranks: the rows one process left are dealt to 2 ranks; "drop" leaves
    # out what 2 do not divide.
    left = rows - len(first)
    after = [rank["after"] for rank in ranks]
    assert_exactly_once(ids_of([first, *after]), range(rows), missing=left % 2)
    # 2 ranks -> one process: 2 ranks' epoch already left out one row.
    before = [rank["before"] for rank in ranks]
    assert [len(b) for b in before] == [K * BATCH] * 2
    again = _loader(data)
    again.load_state_dict(torch.load(tmp_path / "ranks.pt", weights_only=True))
    rest = _read(again)
    assert_exactly_once(ids_of([*before, rest]), range(rows), missing=rows % 2)
