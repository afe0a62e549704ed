"""Gathering an output batch from a shuffle block left in parts (`stream.blocks.BLOCK_PARTS`):
the block as the converter uses it (`BlockParts`), where each row lies (`Picks`) and the gather
itself (`GatherParts`), done straight into its destination like a `Gather`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa

from .arrow_values import Picks, numpy_view

__all__ = ["BlockParts", "GatherParts", "Picks"]


@dataclass(frozen=True, slots=True)
class GatherParts:
    """Rows (first axis) of the ``arrays``, one per part of a block, at ``picks``."""

    arrays: tuple[np.ndarray, ...]
    picks: Picks

    @property
    def dtype(self) -> np.dtype[Any]:
        return np.dtype(self.arrays[0].dtype)

    def into(self, out: np.ndarray) -> None:
        """Gather into ``out`` (the output's shape)."""
        for array, (positions, rows) in zip(self.arrays, self.picks.parts, strict=True):
            if len(positions) == len(out):  # every row from one part: straight in
                array.take(rows, axis=0, out=out)
            elif len(positions):
                out[positions] = array.take(rows, axis=0)


class BlockParts:
    """A shuffle block left in parts (a table over the batches read), as `Converter` uses it:
    where each part starts, the numpy arrays of the columns gathered from the parts (a column
    with nulls is not: its rule fills or masks them), each part's values and offsets of the
    ``listed`` list columns, and the other columns joined, each once."""

    def __init__(
        self, table: pa.Table, gathered: dict[str, int], listed: tuple[str, ...] = ()
    ) -> None:
        self._table = table
        self._joined: dict[str, pa.Array] = {}
        lengths = [len(c) for c in table.column(0).chunks] if table.num_columns else []
        self.starts = np.cumsum([0, *lengths[:-1]]).astype(np.int64)
        self.arrays: dict[str, tuple[np.ndarray, ...]] = {}  # each part's, by column
        for name, size in gathered.items():
            chunks = table.column(name).chunks
            if not chunks or any(c.null_count for c in chunks):
                continue
            if size:
                values = [c.flatten() for c in chunks]  # (respects a chunk's slice offset)
                if any(v.null_count for v in values):
                    continue
                arrays = [
                    numpy_view(v).reshape(len(c), size) for v, c in zip(values, chunks, strict=True)
                ]
            else:
                arrays = [numpy_view(c) for c in chunks]
            self.arrays[name] = tuple(arrays)
        # Variable-length list columns without nulls: each part's values and int64 offsets
        # (`lists.ListParts` gathers from them).
        self.lists: dict[str, tuple[tuple[np.ndarray, ...], tuple[np.ndarray, ...]]] = {}
        for name in listed:
            chunks = table.column(name).chunks
            if not chunks or any(c.null_count or c.values.null_count for c in chunks):
                continue
            # (A chunk's offsets index its whole child even when the chunk is a slice.)
            self.lists[name] = (
                tuple(numpy_view(c.values) for c in chunks),
                tuple(numpy_view(c.offsets).astype(np.int64) for c in chunks),
            )

    def joined(self, name: str) -> pa.Array:
        """Column ``name`` as one array (joined on first use)."""
        array = self._joined.get(name)
        if array is None:
            array = self._joined[name] = self._table.column(name).combine_chunks()
        return array
