"""Credentials from a function: called in each worker, fetched again when refused; secrets stay
out of repr, logs, errors and state."""

from __future__ import annotations

import os
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from torch.utils.data import get_worker_info

import torch_dataloader_utils as tdu

from .conftest import RemoteData

pytestmark = pytest.mark.remote


class ExpiringCredentials:
    """Storage options whose first answer in each DataLoader worker is stale (a wrong secret),
    as when a token expired; later answers are fresh. Each call is recorded in ``log``."""

    def __init__(self, options: dict[str, Any], log: Path) -> None:
        self.options = options
        self.log = log
        self.calls: Counter[int] = Counter()  # per process

    def __call__(self) -> dict[str, Any]:
        self.calls[os.getpid()] += 1
        stale = get_worker_info() is not None and self.calls[os.getpid()] == 1
        with self.log.open("a") as f:
            f.write(f"{os.getpid()} {'stale' if stale else 'fresh'}\n")
        return {**self.options, "secret": "expired-secret"} if stale else self.options


@pytest.mark.parametrize("context", ["fork", "spawn"])
def test_refused_credentials_are_fetched_again_in_each_worker(
    s3_data: RemoteData, tmp_path: Path, context: str
) -> None:
    log = tmp_path / "calls.log"
    options = ExpiringCredentials(s3_data.storage_options, log)
    loader = tdu.create_dataloader(
        s3_data.url,
        batch_size=500,
        shuffle=True,
        num_workers=2,
        multiprocessing_context=context,
        storage_options=options,
        storage_backend="arrow",
    )
    got = Counter(i for batch in loader for i in batch["id"].tolist())
    assert got == Counter(s3_data.ids)
    calls = [line.split() for line in log.read_text().splitlines()]
    workers = {pid for pid, _ in calls if int(pid) != os.getpid()}
    assert len(workers) == 2
    for pid in workers:
        # Each worker got the stale answer first, was refused, and asked again.
        assert [kind for p, kind in calls if p == pid][:2] == ["stale", "fresh"]


def test_secrets_stay_out_of_repr_errors_and_state(s3_data: RemoteData) -> None:
    secret = s3_data.storage_options["secret"]
    loader = tdu.create_dataloader(
        s3_data.url, batch_size=500, num_workers=0, storage_options=s3_data.storage_options
    )
    batches = iter(loader)
    next(batches)
    state = loader.state_dict()
    for text in (repr(loader.dataset), str(loader.dataset), repr(loader.dataset.fs), str(state)):
        assert secret not in text
    wrong = {**s3_data.storage_options, "secret": "not-the-secret"}
    with pytest.raises(tdu.StorageError) as caught:
        tdu.create_dataloader(s3_data.url, batch_size=500, storage_options=wrong)
    assert "not-the-secret" not in str(caught.value) and secret not in str(caught.value)
