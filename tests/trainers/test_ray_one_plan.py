"""Ray Train resumes a state one process saved, over Parquet with fixed-size lists and maps at
depth (``ray_one_plan.py``, for real: 2 CPU workers), with a loader built in the driver and
with one built in the workers (planned over their process group).

Both hold the plan of the process that saved the state: the same fingerprint and the same
schema (pickle once renamed the schema's children on the way into the workers, and planning
over ranks fingerprinted the renamed schema). What the driver read before the save and the
workers after is every row once, less the row 2 ranks leave out.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.distributed.conftest import assert_exactly_once, ids_of
from tests.nested_data import write_nested
from tests.trainers.conftest import run_example

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

SIZES = (51, 37, 41)  # 129 rows


def test_ray_workers_resume_a_one_process_state_with_its_plan(tmp_path: Path) -> None:
    data, out = tmp_path / "data", tmp_path / "out"
    out.mkdir()
    rows = write_nested(data, SIZES)
    script = Path(__file__).with_name("ray_one_plan.py")  # (an absolute path: not an example)
    run_example(str(script), "--data", str(data), "--out", str(out), timeout=240)
    saved = json.loads((out / "driver.json").read_text())
    ranks = [json.loads((out / f"rank{r}.json").read_text()) for r in (0, 1)]
    left = rows - len(saved["ids"])
    for built in ("driver", "worker"):
        for rank in ranks:
            assert rank[built]["fingerprint"] == saved["fingerprint"], built
            assert rank[built]["schema"] == saved["schema"], built
        every = ids_of([saved["ids"], *(rank[built]["ids"] for rank in ranks)])
        assert_exactly_once(every, range(rows), missing=left % 2)
