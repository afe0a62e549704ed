"""Named numpy arrays that pickle compactly, and as one shared-memory buffer to a process
started by multiprocessing (`NamedArrays`): how `planning.chunks` stores its columns.

A spawned DataLoader worker receives them as a shared-memory handle
(`multiprocessing.reduction.ForkingPickler` is given a handle, not the bytes), so a plan reaches
each process once; pickle, torch.save and torch.distributed get the bytes, compressed.
"""

from __future__ import annotations

from collections.abc import Sequence
from multiprocessing.reduction import ForkingPickler
from typing import Any

import numpy as np
import pyarrow as pa
import torch

__all__ = ["NamedArrays", "smallest", "strings"]

_ALIGN = 8
_CODEC = "zstd" if pa.Codec.is_available("zstd") else None


class NamedArrays:
    """Named numpy arrays that pickle as their bytes, and as one shared buffer to a process
    started by multiprocessing (a spawned DataLoader worker)."""

    __slots__ = ("_buffer", "arrays")

    def __init__(self, arrays: dict[str, np.ndarray], buffer: torch.Tensor | None = None) -> None:
        for array in arrays.values():
            array.flags.writeable = False  # a plan is shared: nobody writes to it
        self.arrays = arrays
        self._buffer = buffer  # the shared buffer the arrays view, once made

    def __getstate__(self) -> tuple[str | None, list[tuple[str, str, tuple[int, ...], str]], bytes]:
        # The arrays' bytes, zstd-compressed when pyarrow has the codec: what torch.distributed
        # broadcasts to every rank. Offsets and file numbers go as their steps, which compress
        # to nothing (docs/adr/0020-measurements-behind-constants.md#chunks-as-columns).
        entries = []
        blobs = []
        for key, array in self.arrays.items():
            stored, steps = _as_steps(array)
            entries.append((key, array.dtype.str, array.shape, steps))
            blobs.append(np.ascontiguousarray(stored).tobytes())
        raw = b"".join(blobs)
        if _CODEC is None:
            return None, entries, raw
        return _CODEC, entries, pa.compress(raw, codec=_CODEC, asbytes=True)

    def __setstate__(
        self, state: tuple[str | None, list[tuple[str, str, tuple[int, ...], str]], bytes]
    ) -> None:
        codec, entries, blob = state
        sizes = [
            int(np.prod(shape)) * np.dtype(steps or dtype).itemsize
            for _, dtype, shape, steps in entries
        ]
        if codec is not None:
            blob = pa.decompress(blob, decompressed_size=sum(sizes), codec=codec, asbytes=True)
        self._buffer = None
        self.arrays = {}
        at = 0
        for (key, dtype, shape, steps), size in zip(entries, sizes, strict=True):
            stored = np.dtype(steps or dtype)
            array = np.frombuffer(blob, stored, size // stored.itemsize, at).reshape(shape)
            if steps:
                array = np.cumsum(array, dtype=np.int64).astype(dtype)
                array.flags.writeable = False
            self.arrays[key] = array
            at += size

    def shared(self) -> tuple[torch.Tensor, list[tuple[str, str, tuple[int, ...], int]]]:
        """One shared-memory buffer holding every array, and where each lies in it."""
        entries: list[tuple[str, str, tuple[int, ...], int]] = []
        offset = 0
        for key, array in self.arrays.items():
            entries.append((key, array.dtype.str, array.shape, offset))
            offset += -(-array.nbytes // _ALIGN) * _ALIGN
        if self._buffer is None:
            buffer = torch.empty(max(offset, _ALIGN), dtype=torch.uint8)
            target = buffer.numpy()
            for (_, _, _, at), array in zip(entries, self.arrays.values(), strict=True):
                target[at : at + array.nbytes] = np.ascontiguousarray(array).view(np.uint8).ravel()
            buffer.share_memory_()  # type: ignore[no-untyped-call]
            self._buffer = buffer
            self.arrays = _views(buffer, entries)  # the process's own copy is the shared one
        return self._buffer, entries


def _as_steps(array: np.ndarray) -> tuple[np.ndarray, str]:
    """A signed integer column as its steps from 0 (and their dtype) when they fit a smaller
    type than its values; else the column as it is (and "")."""
    if array.dtype.kind != "i" or array.ndim != 1 or len(array) < 2:
        return array, ""
    steps = smallest(np.diff(array.astype(np.int64), prepend=0))  # (cumsum undoes a wrap)
    if steps.itemsize >= array.itemsize:
        return array, ""
    return steps, steps.dtype.str


def _views(
    buffer: torch.Tensor, entries: list[tuple[str, str, tuple[int, ...], int]]
) -> dict[str, np.ndarray]:
    raw = buffer.numpy()
    out = {}
    for key, dtype, shape, at in entries:
        dt = np.dtype(dtype)
        count = int(np.prod(shape)) if shape else 1
        view = raw[at : at + count * dt.itemsize].view(dt).reshape(shape)
        view.flags.writeable = False
        out[key] = view
    return out


def _rebuild_shared(
    buffer: torch.Tensor, entries: list[tuple[str, str, tuple[int, ...], int]]
) -> NamedArrays:
    return NamedArrays(_views(buffer, entries), buffer)


def _reduce_shared(columns: NamedArrays) -> tuple[Any, tuple[Any, ...]]:
    return _rebuild_shared, columns.shared()


# Only processes started by multiprocessing (spawn and forkserver DataLoader workers, mp.spawn
# ranks) get the handle; pickle, torch.save and torch.distributed get the bytes.
ForkingPickler.register(NamedArrays, _reduce_shared)


def strings(values: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
    """UTF-8 bytes of ``values`` concatenated, and their ``len + 1`` offsets."""
    encoded = [v.encode("utf-8", "surrogateescape") for v in values]
    offsets = np.zeros(len(encoded) + 1, np.int64)
    np.cumsum([len(b) for b in encoded], out=offsets[1:])
    return np.frombuffer(b"".join(encoded), np.uint8), offsets


def smallest(values: np.ndarray) -> np.ndarray:
    """``values`` (integers) in the smallest signed dtype that holds them."""
    if not len(values):
        return values.astype(np.int32)
    low, high = int(values.min()), int(values.max())
    for dtype in (np.int8, np.int16, np.int32):
        info = np.iinfo(dtype)
        if info.min <= low and high <= info.max:
            return values.astype(dtype)
    return values.astype(np.int64)
