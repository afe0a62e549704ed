"""The main-process side (`transport.main`): messages unpacked into batches (`Unbundler`) and put
back in DataLoader's order (`in_order`)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from torch_dataloader_utils.convert import Field
from torch_dataloader_utils.errors import DataError
from torch_dataloader_utils.errors.on_error import ReadFailure
from torch_dataloader_utils.transport import Bundle, PackedBundle, Unbundler, in_order, pack


def test_unbundle_flattens_bundles_and_passes_plain_items_through() -> None:
    packed = pack(
        [
            [Field("v", np.array([1, 2], np.int32), (2,))],
            [Field("v", np.array([3], np.int32), (1,))],
        ]
    )
    plain = {"v": torch.tensor([9], dtype=torch.int32)}
    stream = [plain, Bundle(["a", "b"]), packed, "c", Bundle([]), 7]
    unpack = Unbundler()
    out = [batch for item in stream for batch in unpack(item)]
    assert out[0] is plain
    assert out[1:3] == ["a", "b"]
    assert out[3]["v"].tolist() == [1, 2]
    assert out[4]["v"].tolist() == [3]
    assert out[5:] == ["c", 7]
    assert len(out) == 7


def test_a_bundles_batches_are_made_as_they_are_taken() -> None:
    """A bundle's batches are made one at a time, when the loader takes them: made at once,
    they outlived the youngest objects' collections and brought full collections of the main
    process's heap."""
    made: list[int] = []

    def finish(batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        made.append(int(batch["v"][0]))
        return batch

    def bundle(worker: int, first: int) -> PackedBundle:
        rows = [[Field("v", np.array([first + i], np.int64), (1,))] for i in range(3)]
        packed = pack(rows)
        packed.worker = worker
        return packed

    arrived = [bundle(0, 0), bundle(1, 10)]
    batches = in_order(iter(arrived), [3, 3], [0, 0], Unbundler(finish))
    assert int(next(batches)["v"][0]) == 0 and made == [0]
    assert int(next(batches)["v"][0]) == 10 and made == [0, 10]
    assert [int(b["v"][0]) for b in batches] == [1, 11, 2, 12]
    assert made == [0, 10, 1, 11, 2, 12]


def test_the_failures_a_message_carries_are_collected() -> None:
    failures: list[ReadFailure] = []
    bundle = Bundle(["a"], worker=0)
    bundle.failures = (
        ReadFailure("f.parquet", "chunk 0, rows 0-9", 10, "CorruptFileError", "bad"),
    )
    assert Unbundler(failures=failures)(bundle) == ["a"]
    assert failures == list(bundle.failures)


def messages(*batches: tuple[int, list[str]]) -> list[Bundle]:
    """One bundle per ``(worker, its batches)``, in the order they arrive."""
    return [Bundle(items, worker=worker) for worker, items in batches]


def test_batches_come_out_one_per_worker_in_turn_whatever_the_arrival_order() -> None:
    arrived = messages((1, ["b0", "b1"]), (0, ["a0"]), (1, ["b2"]), (0, ["a1", "a2"]))
    batches = in_order(iter(arrived), [3, 3], [0, 0], Unbundler())
    assert list(batches) == ["a0", "b0", "a1", "b1", "a2", "b2"]


def test_a_resumed_pass_continues_from_the_batches_each_worker_delivered() -> None:
    arrived = messages((0, ["a2"]), (1, ["b1", "b2"]))
    batches = in_order(iter(arrived), [3, 3], [2, 1], Unbundler())
    assert list(batches) == ["b1", "a2", "b2"]


def test_a_worker_that_ends_early_or_a_batch_too_many_is_an_error() -> None:
    short = in_order(iter(messages((0, ["a0"]), (1, ["b0"]))), [2, 1], [0, 0], Unbundler())
    with pytest.raises(DataError, match="worker 0 ended before its 2 planned batches"):
        list(short)
    extra = messages((0, ["a0"]), (1, ["b0", "b1"]))
    with pytest.raises(DataError, match="more batches than planned"):
        list(in_order(iter(extra), [1, 1], [0, 0], Unbundler()))
    with pytest.raises(RuntimeError, match="without its worker id"):
        list(in_order(iter([Bundle(["x"])]), [1], [0], Unbundler()))
