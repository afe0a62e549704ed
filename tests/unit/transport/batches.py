"""Batches of every kind the converter makes, strings among them, and how the transport tests
compare them: shared by test_wire, test_values and test_main (test modules import these from
here, never from each other)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa
import torch

from tests.conftest import make_table
from torch_dataloader_utils.convert import Converter, as_tensor
from torch_dataloader_utils.transport import PackedBundle


def record_batches() -> tuple[Converter, list[pa.RecordBatch]]:
    """Batches of every kind the converter makes, incl. sliced, empty, and odd byte sizes."""
    table = make_table(np.arange(300), emb_dim=3)
    table = table.append_column("small", pa.array(np.arange(300) % 100, pa.int8()))
    table = table.append_column("half", pa.array(np.arange(300) / 7, pa.float16()))
    table = table.append_column(
        "maybe", pa.array([None if i % 4 == 0 else i * 1.5 for i in range(300)], pa.float64())
    )
    rb = table.combine_chunks().to_batches()[0]
    converter = Converter(table.schema, null_policy="mask", pad_value=-1)
    slices = [(0, 64), (64, 13), (77, 0), (79, 1), (3, 200)]
    return converter, [rb.slice(start, length) for start, length in slices]


def direct(converter: Converter, rb: pa.RecordBatch) -> dict[str, Any]:
    return {f.key: as_tensor(f) for f in converter.fields(rb)}


def assert_same_batch(got: dict[str, Any], want: dict[str, Any]) -> None:
    assert list(got) == list(want)
    for key, value in want.items():
        if isinstance(value, torch.Tensor):
            other = got[key]
            assert isinstance(other, torch.Tensor), key
            assert other.dtype == value.dtype, key
            assert other.shape == value.shape, key
            torch.testing.assert_close(other, value, rtol=0, atol=0, equal_nan=True, msg=key)
        else:
            assert got[key] == value, key


WORDS = ["a", "", "héllo", "x" * 100, "日本語", "", "b", "🙂 ok", "c", "nul\x00byte", "end"]


BLOBS = [w.encode() for w in WORDS[:-1]] + [b"\xff\x00\xfe"]  # the last one is not UTF-8


def string_batch() -> tuple[Converter, pa.RecordBatch]:
    rb = pa.RecordBatch.from_arrays(
        [
            pa.array(WORDS, pa.string()),
            pa.array(np.arange(len(WORDS)), pa.int64()),
            pa.array(BLOBS, pa.binary()),
        ],
        names=["s", "id", "b"],
    )
    return Converter(rb.schema), rb


def packed_entries(bundle: PackedBundle, key: str) -> list[Any]:
    """What the bundle's entries hold for ``key``, batch by batch (the packing path taken)."""
    return [where for fields in bundle.entries for k, _, _, where in fields if k == key]


def reference(rb: pa.RecordBatch, name: str, rows: np.ndarray | None) -> list[Any]:
    values = rb.column(name).to_pylist()
    return values if rows is None else [values[i] for i in rows]


PERMUTATION = np.array([6, 0, 3, 1, 5, 2, 4])  # of the 7 rows of rb.slice(3, 7)


def in_shared_memory(tensor: torch.Tensor) -> bool:
    """Whether ``tensor``'s memory is shared between processes: torch's (/dev/shm) or one of
    our memfds, as this process's memory map names it."""
    if tensor.is_shared():
        return True
    address = tensor.untyped_storage().data_ptr()
    with open("/proc/self/maps") as maps:
        for line in maps:
            low, high = (int(x, 16) for x in line.split()[0].split("-"))
            if low <= address < high:
                return "/memfd:tdu-bundle" in line
    return False
