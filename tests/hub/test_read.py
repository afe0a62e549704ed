"""Parquet on a local Hub read through hf:// paths: every row once over ranks and DataLoader
workers (fork and spawn), and the requests it takes: one revision request and one listing per
job, at planning; workers make ranged resolve GETs only."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import pytest

import torch_dataloader_utils as tdu
from tests.hub.conftest import shards
from tests.services.hub import HubServer

pytestmark = [
    pytest.mark.timeout(300),
    pytest.mark.filterwarnings("ignore:This DataLoader will create:UserWarning"),
]

ROWS = 50  # per file; 4 files, 2 row groups each
EXPECTED = list(range(4 * ROWS))


@pytest.fixture(scope="module")
def repo(hub: HubServer) -> str:
    """org/read: four files under data/, and a README the glob leaves out."""
    hub.create("org/read", {**shards(0, 4, ROWS), "README.md": b"# read\n"})
    return "org/read"


def ids_of(batches: Iterable[dict[str, Any]]) -> list[int]:
    return [int(i) for b in batches for i in b["id"]]


def make(
    path: str, rank: int = 0, world_size: int = 1, format: str = "parquet", **options: Any
) -> Any:
    return tdu.create_dataloader(
        path,
        format=format,
        batch_size=16,
        shuffle=True,
        rank=rank,
        world_size=world_size,
        timeout=60,
        **options,
    )


@pytest.mark.parametrize(
    ("workers", "context", "epochs"), [(0, None, 2), (2, "fork", 2), (2, "spawn", 1)]
)
def test_every_row_once_over_ranks(
    fresh: HubServer, repo: str, workers: int, context: str | None, epochs: int
) -> None:
    options: dict[str, Any] = {"num_workers": workers}
    if context is not None:
        options["multiprocessing_context"] = context
    path = f"hf://datasets/{repo}/data/*.parquet"
    loaders = []
    for rank in range(2):
        before = dict(fresh.counts)
        loaders.append(make(path, rank, 2, **options))
        planned = {k: fresh.counts[k] - before.get(k, 0) for k in ("info", "tree", "paths-info")}
        # Each job plans once: one revision request, one listing, no paths-info.
        assert planned == {"info": 1, "tree": 1, "paths-info": 0}
    at_planning = dict(fresh.counts)
    for epoch in range(epochs):
        seen: list[int] = []
        counts = []
        for loader in loaders:
            loader.set_epoch(epoch)
            batches = list(loader)
            counts.append(len(batches))
            seen += ids_of(batches)
        assert sorted(seen) == EXPECTED, f"epoch {epoch}"
        assert counts[0] == counts[1]
    # Reading asks nothing but resolve GETs: no revision, listing, paths-info or HEAD request.
    for endpoint in ("info", "tree", "paths-info", "resolve-head"):
        assert fresh.counts[endpoint] == at_planning.get(endpoint, 0), endpoint
    assert fresh.counts["resolve"] > at_planning["resolve"]


def test_plan_pins_the_commit_and_file_identities(fresh: HubServer, repo: str) -> None:
    commit = fresh.repos[repo].refs["main"]
    loader = make(f"hf://datasets/{repo}/data/*.parquet")
    plan = loader.dataset.plan
    assert dict(plan.details)["commit"] == commit
    paths = sorted(set(plan.chunks.paths))
    assert paths == [f"datasets/{repo}@{commit}/data/part-{i}.parquet" for i in range(4)]
    versions = {v for _, v in plan.files.values()}
    assert versions and all(v.startswith("sha256=") for v in versions)
    assert sorted(ids_of(loader)) == EXPECTED


def test_a_listing_of_several_pages(fresh: HubServer, repo: str) -> None:
    fresh.page_size = 3  # data/ holds 4 files: two pages
    try:
        loader = make(f"hf://datasets/{repo}/data/*.parquet")
    finally:
        fresh.page_size = 1000
    assert fresh.counts["info"] == 1 and fresh.counts["tree"] == 2
    assert sorted(ids_of(loader)) == EXPECTED


@pytest.mark.parametrize(
    ("inner", "expected"),
    [("data", EXPECTED), ("data/part-2.parquet", list(range(2 * ROWS, 3 * ROWS)))],
)
def test_a_directory_and_a_file_by_name(
    fresh: HubServer, repo: str, inner: str, expected: list[int]
) -> None:
    loader = make(f"hf://datasets/{repo}/{inner}", num_workers=2, multiprocessing_context="fork")
    assert fresh.counts["info"] == 1
    assert sorted(ids_of(loader)) == expected
    assert fresh.counts["paths-info"] == 0 and fresh.counts["resolve-head"] == 0


def test_through_the_node_local_cache(fresh: HubServer, repo: str, tmp_path: Any) -> None:
    path = f"hf://datasets/{repo}/data/*.parquet"
    first = make(path, num_workers=2, multiprocessing_context="fork", cache_dir=tmp_path)
    assert sorted(ids_of(first)) == EXPECTED
    fresh.reset()
    # A second job at the same commit: planned (one revision request, one listing) and read
    # from the cache; the files' bytes are not asked again.
    second = make(path, num_workers=2, multiprocessing_context="fork", cache_dir=tmp_path)
    assert sorted(ids_of(second)) == EXPECTED
    assert dict(fresh.counts) == {"info": 1, "tree": 1}


def test_json_lines_are_read_at_the_commit_by_ranged_gets(fresh: HubServer) -> None:
    lines = {
        f"text/part-{i}.jsonl": "".join(
            f'{{"id": {j}, "text": "row {j}"}}\n' for j in range(i * 30, (i + 1) * 30)
        ).encode()
        for i in range(3)
    }
    fresh.create("org/text", lines)
    loader = make("hf://datasets/org/text/text/*.jsonl", format="json", num_workers=2)
    assert sorted(ids_of(loader)) == list(range(90))
    assert (fresh.counts["info"], fresh.counts["tree"]) == (1, 1)  # at planning, nothing after
    assert fresh.counts["paths-info"] == 0 and fresh.counts["resolve-head"] == 0
