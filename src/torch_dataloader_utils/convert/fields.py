"""A converted column before it becomes a tensor or array (`Field`), and the last step."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeAlias

import numpy as np
import pyarrow as pa
import torch
from torch.utils.dlpack import from_dlpack

from .arrow_values import numpy_view
from .lists import ListRows
from .parts import GatherParts

__all__ = ["Field", "Gather", "Written", "as_numpy", "as_tensor"]


@dataclass(frozen=True, slots=True)
class Gather:
    """Rows ``rows`` (first axis) of ``array``: a gather not yet done, so that it can be done
    straight into its destination (a packed transport buffer)."""

    array: np.ndarray
    rows: np.ndarray


@dataclass(frozen=True, slots=True)
class Written:
    """Values not written yet: ``write(out)`` writes them into ``out`` (``dtype``, the field's
    shape), so that they are made straight in their destination (a packed transport buffer)
    like a `Gather`: a packed batch's arrays (`stream.packing`)."""

    dtype: np.dtype[Any]
    write: Callable[[np.ndarray], None]

    def into(self, out: np.ndarray) -> None:
        self.write(out)


# Made where they go (`into`): a gather from a block's parts, list rows, written values.
InPlace: TypeAlias = "GatherParts | ListRows | Written"
IN_PLACE = (GatherParts, ListRows, Written)

Data: TypeAlias = "pa.Array | np.ndarray | Gather | InPlace | list[Any]"


@dataclass(slots=True)
class Field:
    """One converted output value before it becomes a tensor or array.

    Attributes:
        key: the output key.
        data: a null-free primitive Arrow array (zero-copy source), a numpy array, a
            `Gather` of rows of a numpy array (`GatherParts`: of a block's parts), list rows
            to lay out (`ListRows`), values to write (`Written`); or, when ``shape`` is
            ``None``, a Python list or a string/binary Arrow array that becomes one.
        shape: the output shape.
    """

    key: str
    data: Data
    shape: tuple[int, ...] | None


def as_numpy(field: Field) -> Any:
    """A field as a numpy array (read-only when it is a zero-copy view of Arrow memory)."""
    data = field.data
    if field.shape is None:
        return data.to_pylist() if isinstance(data, pa.Array) else data
    if isinstance(data, Gather):
        # (The array's method, not np.take, whose wrapper costs each batch:
        # docs/adr/0020-measurements-behind-constants.md#converting-rows)
        taken = data.array.take(data.rows, axis=0)
        return taken if taken.shape == field.shape else taken.reshape(field.shape)
    if isinstance(data, IN_PLACE):
        out = np.empty(field.shape, data.dtype)
        data.into(out)
        return out
    if isinstance(data, pa.Array):
        data = numpy_view(data)
    return np.asarray(data).reshape(field.shape)


def as_tensor(field: Field) -> Any:
    """A field as a tensor: zero-copy through DLPack from Arrow, or from a numpy array."""
    data = field.data
    if field.shape is None:
        return data.to_pylist() if isinstance(data, pa.Array) else data
    if isinstance(data, pa.Array):
        return from_dlpack(data).view(field.shape)
    return torch.from_numpy(as_numpy(field))
