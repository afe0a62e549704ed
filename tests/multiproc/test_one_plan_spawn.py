"""A plan pickled into spawned DataLoader workers is the plan of the main process, for data with
fixed-size lists and maps at depth (pickle renames their children): the same fingerprint and
the same schema in every worker, and a state saved with no workers resumes with spawned ones
and back, every row once. Real files, real spawned workers."""

from __future__ import annotations

import functools
import json
from collections import Counter
from itertools import islice
from pathlib import Path
from typing import Any

import pytest
import torch.utils.data

import torch_dataloader_utils as tdu
from tests.nested_data import check_batch, write_nested

pytestmark = [
    pytest.mark.timeout(180),
    pytest.mark.filterwarnings("ignore:This DataLoader will create:UserWarning"),
]

SIZES = (50, 37, 41)
BATCH, STOP = 8, 5


def report_plan(folder: str, worker_id: int) -> None:
    """A ``worker_init_fn``: the worker writes the fingerprint and schema of its copy of the
    plan to ``folder``."""
    dataset = torch.utils.data.get_worker_info().dataset
    plan = dataset.plan
    seen = {"fingerprint": plan.fingerprint, "schema": plan.schema.to_string()}
    Path(folder, f"worker-{worker_id}.json").write_text(json.dumps(seen))


def _loader(data: Path, workers: int, reports: Path) -> tdu.TabularDataLoader:
    spawned: dict[str, Any] = {}
    if workers:
        spawned = {
            "multiprocessing_context": "spawn",
            "timeout": 90,
            "worker_init_fn": functools.partial(report_plan, str(reports)),
        }
    return tdu.create_dataloader(
        str(data), batch_size=BATCH, shuffle=True, shuffle_seed=5, num_workers=workers, **spawned
    )


def _read(loader: tdu.TabularDataLoader, stop: int | None = None) -> list[int]:
    return [i for batch in islice(loader, stop) for i in check_batch(batch)]


@pytest.mark.parametrize(("saved_with", "resumed_with"), [(0, 2), (2, 0)])
def test_spawned_workers_plan_as_the_main_process_and_states_cross(
    tmp_path: Path, saved_with: int, resumed_with: int
) -> None:
    data, reports = tmp_path / "data", tmp_path / "reports"
    reports.mkdir()
    rows = write_nested(data, SIZES)
    saver = _loader(data, saved_with, reports)
    before = _read(saver, STOP)
    state = saver.state_dict()
    resumer = _loader(data, resumed_with, reports)
    resumer.load_state_dict(state)
    after = _read(resumer)
    assert Counter(before + after) == Counter(range(rows))  # every row of epoch 0 exactly once
    main = saver.dataset.plan
    seen = [json.loads(p.read_text()) for p in sorted(reports.glob("worker-*.json"))]
    assert len(seen) == 2
    for worker in seen:
        assert worker == {"fingerprint": main.fingerprint, "schema": main.schema.to_string()}
    assert resumer.dataset.plan.fingerprint == main.fingerprint
