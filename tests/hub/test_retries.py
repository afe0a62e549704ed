"""429 answers with Retry-After, on every request a Hub read makes (the revision, the listing,
the ranged resolve GETs at planning and in workers): waited out and retried, every row read
once, none twice."""

from __future__ import annotations

import time

import pytest

from tests.hub.conftest import shards
from tests.hub.test_read import ids_of, make
from tests.services.hub import HubServer

pytestmark = [
    pytest.mark.timeout(300),
    pytest.mark.filterwarnings("ignore:This DataLoader will create:UserWarning"),
]

EXPECTED = list(range(160))


@pytest.fixture(scope="module")
def repo(hub: HubServer) -> str:
    hub.create("org/throttled", shards(0, 4, 40))
    return "org/throttled"


def test_429s_at_planning_and_in_workers(fresh: HubServer, repo: str) -> None:
    fresh.inject("info", 1)
    fresh.inject("tree", 2)
    fresh.inject("resolve", 3)
    loader = make(
        f"hf://datasets/{repo}/data/*.parquet", num_workers=2, multiprocessing_context="fork"
    )
    assert fresh.faulted == {"info": 1, "tree": 2, "resolve": 3}
    # Each answered once the 429s are spent: one revision request, one listing.
    assert fresh.counts["info"] == 2 and fresh.counts["tree"] == 3
    fresh.inject("resolve", 4)  # the workers' reads now
    assert sorted(ids_of(loader)) == EXPECTED
    assert fresh.faulted["resolve"] == 7
    loader.set_epoch(1)
    fresh.inject("resolve", 2)
    assert sorted(ids_of(loader)) == EXPECTED
    assert fresh.faulted["resolve"] == 9
    assert fresh.counts["info"] == 2 and fresh.counts["tree"] == 3


def test_retry_after_is_waited(fresh: HubServer, repo: str) -> None:
    fresh.inject("info", 1, retry_after="1")
    began = time.monotonic()
    loader = make(f"hf://datasets/{repo}/data/*.parquet")
    assert time.monotonic() - began >= 1.0
    assert fresh.faulted["info"] == 1
    assert sorted(ids_of(loader)) == EXPECTED
