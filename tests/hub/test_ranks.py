"""Two ranks under torchrun (gloo) reading a Hub path: rank 0 alone resolves the revision and
lists the files (one revision request, one listing for the whole job); the workers of every
rank make resolve GETs only; every row once per epoch, equal batches per rank."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.distributed.conftest import run_script
from tests.hub.conftest import shards
from tests.services.hub import HubServer

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]

EPOCHS = 2


def test_one_listing_for_two_ranks(hub: HubServer, tmp_path: Path) -> None:
    hub.create("org/ranks", shards(0, 4, 40))
    hub.reset()
    spec = {
        "data": "hf://datasets/org/ranks/data/*.parquet",
        "out": str(tmp_path / "out.json"),
        "cases": [{"name": "w2", "num_workers": 2, "epochs": EPOCHS, "batch_size": 10}],
    }
    result, _ = run_script("read_epochs.py", 2, spec)  # (HF_ENDPOINT: from this process)
    ranks = result["w2"]
    assert hub.counts["info"] == 1 and hub.counts["tree"] == 1
    assert hub.counts["paths-info"] == 0 and hub.counts["resolve-head"] == 0
    assert ranks[0]["list_files"] == 1 and ranks[1]["list_files"] == 0
    assert ranks[0]["fingerprint"] == ranks[1]["fingerprint"]
    for epoch in range(EPOCHS):
        batches = [rank["epochs"][epoch] for rank in ranks]
        assert len(batches[0]) == len(batches[1])
        seen = [i for rank in batches for batch in rank for i in batch]
        assert sorted(seen) == list(range(160)), f"epoch {epoch}"
