"""Batches handed on a device (`create_dataloader(device=...)`): each batch's copy starts a batch
before it is handed out (`transport.device.ahead`), and the look-ahead changes neither the
batches nor what a state saved between them resumes.

There is no GPU here: the copies go to the ``meta`` device, which runs the same look-ahead as
any device but CUDA (whose two streams `benchmarks/gpu.py` exercises where a GPU is lent).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from tests.multiproc.test_resume import (
    assert_every_row_once,
    interrupted,
    make_loader,
    read,
    saved,
    source,  # noqa: F401  (a fixture)
)
from torch_dataloader_utils.transport.device import SIDE_STREAM_BYTES, ahead, batch_nbytes

pytestmark = [pytest.mark.timeout(120)]


def test_each_copy_starts_a_batch_before_it_is_handed_out() -> None:
    events: list[tuple[str, int]] = []

    def copy(batch: int) -> Any:
        events.append(("copy", batch))

        def finish() -> int:
            events.append(("hand", batch))
            return batch

        return finish

    handed = []
    for batch in ahead(iter(range(4)), copy, 1):
        handed.append(batch)
        events.append(("step", batch))
    assert handed == [0, 1, 2, 3]
    assert events == [
        ("copy", 0),
        ("copy", 1),
        ("hand", 0),
        ("step", 0),
        ("copy", 2),
        ("hand", 1),
        ("step", 1),
        ("copy", 3),
        ("hand", 2),
        ("step", 2),
        ("hand", 3),
        ("step", 3),
    ]
    assert list(ahead(iter([]), copy, 1)) == []


def test_a_batch_s_bytes_are_its_tensors_wherever_they_sit() -> None:
    # (what chooses a CUDA batch's stream: `SIDE_STREAM_BYTES`)
    batch = {
        "ids": torch.zeros(1024, dtype=torch.int64),
        "emb": torch.zeros(1024, 64)[:, :32],  # a view: its own bytes, not its storage's
        "pair": (torch.zeros(3, dtype=torch.bool), ["text"]),
        "names": ["a", "b"],
    }
    assert batch_nbytes(batch) == 1024 * 8 + 1024 * 32 * 4 + 3
    assert batch_nbytes({"names": ["a"]}) == 0
    assert batch_nbytes(torch.zeros(SIDE_STREAM_BYTES, dtype=torch.uint8)) == SIDE_STREAM_BYTES


@pytest.mark.parametrize("num_workers", [0, 2])
def test_a_state_saved_between_device_batches_resumes_every_row_once(
    source: Path,  # noqa: F811
    num_workers: int,
) -> None:
    head, state = interrupted(source, 7, epoch=1, num_workers=num_workers)
    loader = make_loader(source, num_workers=num_workers, device="meta")
    loader.set_epoch(1)
    batches = iter(loader)
    sizes = []
    for _ in range(7):
        batch = next(batches)
        assert batch["id"].device == torch.device("meta")
        sizes.append(len(batch["id"]))
    # The batch copied ahead is not counted as delivered: the state is the one of a loader
    # on the CPU after the same 7 batches.
    on_device = saved(loader)
    assert on_device == state
    assert sizes == [len(b) for b in head]
    del batches
    resumed = make_loader(source, num_workers=num_workers)
    resumed.load_state_dict(on_device)
    assert_every_row_once(head + read(resumed))
