"""Revisions of Hub paths: resolved once at planning to a commit, read at that commit even
when the branch moves; a state saved at another commit is refused with the commit to put in
the path; tags and refs/convert/parquet; the errors of planning (missing repository or
revision, private or gated repository without a token)."""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest

import torch_dataloader_utils as tdu
from tests.hub.conftest import shards
from tests.hub.test_read import ids_of, make
from tests.services.hub import HubServer, quoted_revision
from torch_dataloader_utils.errors import (
    StateMismatchError,
    StorageNotFoundError,
    StoragePermissionError,
)

pytestmark = [
    pytest.mark.timeout(300),
    pytest.mark.filterwarnings("ignore:This DataLoader will create:UserWarning"),
]

FIRST = list(range(0, 120))
SECOND = list(range(1000, 1090))


def test_a_push_after_planning_is_not_read(hub: HubServer) -> None:
    first = hub.create("org/moving", shards(0, 3, 40))
    path = "hf://datasets/org/moving/data/*.parquet"
    old = make(path, num_workers=2, multiprocessing_context="fork")
    saved = old.state_dict()
    second = hub.push("org/moving", shards(1000, 3, 30))  # main moves, other files and ids
    assert sorted(ids_of(old)) == FIRST  # workers read the planned commit, not main
    old.set_epoch(1)
    assert sorted(ids_of(old)) == FIRST

    new = make(path)
    assert dict(new.dataset.plan.details)["commit"] == second
    assert sorted(ids_of(new)) == SECOND
    with pytest.raises(StateMismatchError) as refused:
        make(path).load_state_dict(saved)
    message = str(refused.value)
    assert first in message and second in message and f"@{first}" in message

    # The path at the saved commit takes the state back.
    pinned = make(f"hf://datasets/org/moving@{first}/data/*.parquet")
    pinned.load_state_dict(saved)
    assert sorted(ids_of(pinned)) == FIRST


@pytest.fixture(scope="module")
def tagged(hub: HubServer) -> dict[str, str]:
    """org/tagged: v1.0 at the first commit; main moved on; refs/convert/parquet at a commit
    of converted files under default/train/."""
    first = hub.create("org/tagged", shards(0, 3, 40))
    hub.tag("org/tagged", "v1.0", first)
    converted = hub.push("org/tagged", shards(5000, 2, 20, "default/train"), branch="convert")
    hub.tag("org/tagged", "refs/convert/parquet", converted)
    main = hub.push("org/tagged", shards(1000, 3, 30))
    return {"first": first, "converted": converted, "main": main}


@pytest.mark.parametrize(
    ("revision", "inner", "commit", "expected"),
    [
        ("v1.0", "data/*.parquet", "first", FIRST),
        ("refs/convert/parquet", "default/train/*.parquet", "converted", list(range(5000, 5040))),
        ("", "data/*.parquet", "main", SECOND),
        ("<first>", "data", "first", FIRST),
    ],
)
def test_revisions_resolve_to_their_commit(
    hub: HubServer,
    tagged: dict[str, str],
    revision: str,
    inner: str,
    commit: str,
    expected: list[int],
) -> None:
    if revision == "<first>":
        revision = tagged["first"]
    at = f"@{quoted_revision(revision)}" if revision else ""
    loader = make(
        f"hf://datasets/org/tagged{at}/{inner}", num_workers=2, multiprocessing_context="fork"
    )
    assert dict(loader.dataset.plan.details)["commit"] == tagged[commit]
    assert all(f"@{tagged[commit]}/" in p for p in loader.dataset.plan.chunks.paths)
    assert sorted(ids_of(loader)) == expected


def test_a_mixture_of_two_revisions(hub: HubServer, tagged: dict[str, str]) -> None:
    loader = tdu.create_dataloader(
        [
            tdu.Source("hf://datasets/org/tagged@v1.0/data/*.parquet", weight=1),
            tdu.Source("hf://datasets/org/tagged/data/*.parquet", weight=1),
        ],
        format="parquet",
        batch_size=10,
        shuffle=True,
    )
    seen = ids_of(loader)
    # Quotas of 105 rows each: 105 of v1.0's 120 rows once; all 90 of main's, 15 twice.
    old = [i for i in seen if i in set(FIRST)]
    new = Counter(i for i in seen if i in set(SECOND))
    assert len(seen) == 210 and len(old) == 105 and len(set(old)) == 105
    assert sorted(new) == SECOND and sum(new.values()) == 105 and max(new.values()) == 2


@pytest.fixture(scope="module")
def restricted(hub: HubServer) -> None:
    """org/private (read with the server's token only) and org/gated."""
    hub.create("org/private", shards(0, 1, 10), private=True)
    hub.create("org/gated", shards(0, 1, 10), gated=True)


@pytest.mark.parametrize(
    ("path", "error", "words"),
    [
        (
            "hf://datasets/org/absent/data/*.parquet",
            StorageNotFoundError,
            ["org/absent", "not found"],
        ),
        (
            "hf://datasets/org/tagged@v9/data/*.parquet",
            StorageNotFoundError,
            ["'v9'", "org/tagged"],
        ),
        ("hf://datasets/org/tagged/nothing/x.parquet", StorageNotFoundError, ["nothing/x.parquet"]),
        (
            "hf://datasets/org/private/data/*.parquet",
            StoragePermissionError,
            ["HF_TOKEN", "org/private"],
        ),
        ("hf://datasets/org/gated/data/*.parquet", StoragePermissionError, ["gated", "HF_TOKEN"]),
    ],
)
def test_errors_at_planning(
    restricted: None, tagged: dict[str, str], path: str, error: type[Exception], words: list[str]
) -> None:
    with pytest.raises(error) as raised:
        make(path)
    for word in words:
        assert word in str(raised.value)


def test_a_private_repository_with_a_token(hub: HubServer, restricted: None) -> None:
    options: dict[str, Any] = {"token": hub.token}
    loader = make(
        "hf://datasets/org/private/data/*.parquet",
        storage_options=options,
        num_workers=2,
        multiprocessing_context="fork",
    )
    assert sorted(ids_of(loader)) == list(range(10))
