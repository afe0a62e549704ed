"""A converted column before it becomes a tensor or array (`Field`), and the last step."""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NamedTuple, TypeAlias

import numpy as np
import pyarrow as pa
import torch
from torch.utils.dlpack import from_dlpack

from .arrow_values import numpy_view
from .lists import ListParts, ListRows
from .parts import GatherParts

__all__ = ["Field", "Gather", "Planned", "as_numpy", "as_tensor", "copied", "each_written"]


@dataclass(frozen=True, slots=True)
class Gather:
    """Rows ``rows`` (first axis) of ``array``: a gather not yet done, so that it can be done
    straight into its destination (a packed transport buffer)."""

    array: np.ndarray
    rows: np.ndarray


class Planned(NamedTuple):
    """A batch whose arrays one call writes (`transport.wire.pack_planned`).

    Attributes:
        layout: its values in order: ``(key, dtype, shape)`` an array, laid out in the buffer;
            ``(key, None, value)`` a plain value (an int, a float).
        write: writes the arrays, given each one's place (flat, in ``layout``'s order); returns
            the entries of ``layout`` the writing settled, by index (an array's shape, at most
            its place: the rest unused; a value), or ``None``.
    """

    layout: list[tuple[str, Any, Any]]
    write: Callable[[list[np.ndarray]], dict[int, Any] | None]

    @property
    def nbytes(self) -> int:
        """The bytes its arrays' places take."""
        return sum(
            math.prod(shape) * dtype.itemsize
            for _, dtype, shape in self.layout
            if dtype is not None
        )


def copied(array: np.ndarray) -> Callable[[np.ndarray], None]:
    """A writer of ``array``'s values into a place of as many (a `Planned` batch's array)."""
    return functools.partial(_copy, array)


def each_written(writers: list[Callable[[np.ndarray], None]]) -> Callable[[list[np.ndarray]], None]:
    """One writer of several arrays (a `Planned` batch's): each array's writer given its place."""
    return functools.partial(_write_each, writers)


def _copy(array: np.ndarray, out: np.ndarray) -> None:
    out[...] = array.reshape(out.shape)


def _write_each(writers: list[Callable[[np.ndarray], None]], places: list[np.ndarray]) -> None:
    for write, out in zip(writers, places, strict=True):
        write(out)


# Made where they go (`into`): a gather from a block's parts, list rows (of a block's parts).
InPlace: TypeAlias = "GatherParts | ListRows | ListParts"
IN_PLACE = (GatherParts, ListRows, ListParts)

Data: TypeAlias = "pa.Array | np.ndarray | Gather | InPlace | list[Any]"


@dataclass(slots=True)
class Field:
    """One converted output value before it becomes a tensor or array.

    Attributes:
        key: the output key.
        data: a null-free primitive Arrow array (zero-copy source), a numpy array, a
            `Gather` of rows of a numpy array (`GatherParts`: of a block's parts), list rows
            to lay out (`ListRows`; `ListParts`: of a block's parts); or, when ``shape`` is
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
