"""Exact resume of a Hub read (the library's resume harness), workers and shuffle."""

from __future__ import annotations

import pytest

from tests.hub.conftest import shards
from tests.hub.test_read import make
from tests.services.hub import HubServer
from torch_dataloader_utils.testing import check_resume

pytestmark = [
    pytest.mark.timeout(300),
    pytest.mark.filterwarnings("ignore:This DataLoader will create:UserWarning"),
]


def test_exact_resume(hub: HubServer) -> None:
    hub.create("org/resume", shards(0, 3, 40))
    check_resume(
        lambda: make(
            "hf://datasets/org/resume/data/*.parquet",
            num_workers=2,
            multiprocessing_context="fork",
        ),
        expected_ids=list(range(120)),
        positions=[0, 3, 7],
    )
