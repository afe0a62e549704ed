"""Small shuffled batches of many numeric columns: a block's columns stacked once, so that each
batch takes its rows of all of them in one gather.

Converting column by column costs each column a rule, a gather and a tensor a batch, which at 8
rows a batch is most of the time; stacks halve it
(docs/adr/0020-measurements-behind-constants.md#converting-rows).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa
import torch

from .arrow_values import numpy_view

__all__ = ["STACK_ROWS", "Stacks"]

# Batches of fewer rows than this take their numeric columns from stacks. Stacking copies
# those columns of the block once; at this size each batch saves more than its rows' share.
STACK_ROWS = 128


class Stacks:
    """The null-free numeric columns of one block, stacked by type: an array of (columns,
    rows) per type, each column a contiguous row of it.

    Args:
        batch: the block.
        groups: the names of the columns that may be stacked, by type.
    """

    def __init__(self, batch: pa.RecordBatch, groups: list[list[str]]) -> None:
        self._stacks: list[tuple[list[str], np.ndarray]] = []
        for names in groups:
            usable = [(name, batch.column(name)) for name in names]
            usable = [(name, array) for name, array in usable if not array.null_count]
            if usable:  # (a column with nulls in this block goes through its rule)
                values = [numpy_view(array) for _, array in usable]
                self._stacks.append(([name for name, _ in usable], np.stack(values)))

    def take(self, rows: np.ndarray, *, tensors: bool) -> dict[str, Any]:
        """Rows ``rows`` of every stacked column, by name: tensors, or numpy arrays."""
        out: dict[str, Any] = {}
        for names, stack in self._stacks:
            taken = stack.take(rows, axis=1)  # (columns, len(rows)), each row contiguous
            out.update(
                zip(names, torch.from_numpy(taken).unbind(0) if tensors else taken, strict=True)
            )
        return out
