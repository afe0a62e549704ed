"""A Lance dataset read by real DataLoader workers started by fork, forkserver and spawn, on two
ranks: every live row once (deletion files applied), equal batches. pylance warns that it is not
fork-safe: the planning process opens (and, with a filter, reads) the dataset before the
workers start, and each worker must open its own. Each start method runs in its own process
with a timeout, so that a deadlock fails the test instead of hanging the suite."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from collections import Counter
from pathlib import Path

import pytest

from tests.lance.data import live_ids, write_dataset

pytestmark = pytest.mark.timeout(240)

ROOT = Path(__file__).resolve().parents[2]

SCRIPT = """
import json, sys, warnings
import pyarrow.compute as pc
import torch_dataloader_utils as tdu

spec = json.loads(sys.argv[1])
warnings.filterwarnings("ignore", message="lance is not fork-safe")
out = []
for rank in range(2):
    loader = tdu.create_dataloader(
        spec["uri"], format="lance", columns=["id", "tokens"], filters=pc.field("label") != 3,
        batch_size=8, shuffle=True, num_workers=2, timeout=60,
        multiprocessing_context=spec["context"], rank=rank, world_size=2,
    )
    batches = [b["id"].tolist() for b in loader]
    out.append({"batches": batches, "len": len(loader)})
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def uri(tmp_path_factory: pytest.TempPathFactory) -> str:
    return write_dataset(tmp_path_factory.mktemp("lance-workers") / "w.lance")


@pytest.mark.parametrize(
    "context",
    [
        "fork",
        # Their workers import torch (about 10 s each here).
        pytest.param("forkserver", marks=pytest.mark.slow),
        pytest.param("spawn", marks=pytest.mark.slow),
    ],
)
def test_workers_of_every_start_method_read_each_live_row_once(uri: str, context: str) -> None:
    spec = json.dumps({"uri": uri, "context": context})
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(SCRIPT), spec],
        capture_output=True,
        text=True,
        timeout=150,
        cwd=ROOT,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    ranks = json.loads(done.stdout.strip().splitlines()[-1])
    expected = [i for i in live_ids(4) if i % 7 != 3]
    got = Counter(i for rank in ranks for batch in rank["batches"] for i in batch)
    assert max(got.values()) == 1 and set(got) <= set(expected)
    assert len(expected) - len(got) == len(expected) % 2  # "drop": the remainder of 2 ranks
    counts = [len(rank["batches"]) for rank in ranks]
    assert counts[0] == counts[1] == ranks[0]["len"] == ranks[1]["len"] > 0
