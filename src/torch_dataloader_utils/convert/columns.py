"""What each column becomes, by its type: the rule the schema picks for it (`ColumnRules.rule_for`)
and what the rule does with a batch's rows. The mapping is in the package docstring.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeAlias

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ..errors import InvalidArgumentError, NullValueError, UnsupportedTypeError
from .arrow_values import (
    arrow_of,
    as_plain,
    bool_view,
    holds_interval,
    intervals,
    numpy_view,
    python_type,
    take,
    temporal_int,
    valid_view,
)
from .fields import Field, Gather
from .last_block import LastBlock
from .lists import ListParts, ListRows, fixed_values

__all__ = ["ColumnRules", "Rows", "Rule", "is_numeric"]

Rows: TypeAlias = "np.ndarray | None"


def is_numeric(t: pa.DataType) -> bool:
    return bool(pa.types.is_integer(t) or pa.types.is_floating(t))


def _check_pad_value(name: str, pad_value: float, value_type: pa.DataType) -> None:
    dtype = np.dtype(value_type.to_pandas_dtype())
    try:
        with np.errstate(invalid="ignore", over="ignore"):
            cast = np.array(pad_value).astype(dtype)
        exact = bool(cast == pad_value) or (np.isnan(pad_value) and dtype.kind == "f")
    except (OverflowError, ValueError):
        exact = False
    if not exact:
        raise InvalidArgumentError(
            f"pad_value={pad_value!r} cannot be stored in column {name!r} of type {value_type}"
        )


def _fill_value(t: pa.DataType) -> pa.Scalar:
    """What fills a null of type ``t``: NaN, else 0 (False), made from a buffer (``pa.scalar``
    of a Python value loads pandas: `arrow_values.arrow_of`)."""
    if pa.types.is_floating(t):
        return arrow_of(np.full(1, np.nan, t.to_pandas_dtype()))[0]
    width = getattr(t, "bit_width", 0)
    if not width:
        return pa.scalar(0, t)
    zeros = pa.py_buffer(np.zeros(-(-width // 8), np.uint8))
    return pa.Array.from_buffers(t, 1, [None, zeros])[0]


# A rule gets a column, the rows to output (`Rows`) and their number.
Rule = Callable[[pa.Array, "np.ndarray | None", int], list[Field]]


class ColumnRules:
    """The rules of one converter's options (``list_format``, ``null_policy``, ``pad_value``).

    `rule_for` also notes the columns whose nulls are an error (``no_nulls``, for
    `Converter.check`) and the list columns that become nested tensors (``nested``).
    """

    def __init__(self, list_format: str, null_policy: str, pad_value: int | float) -> None:
        self.list_format = list_format
        self.null_policy = null_policy
        self.pad_value = pad_value
        self.no_nulls: list[str] = []
        self.nested: list[str] = []
        # Each null-free list column's values (and offsets) as numpy, made once a block
        # (`_block_values`): small batches cut from one block each made them again
        # (docs/benchmarks.md#small-batches-list-columns).
        self._values: dict[str, LastBlock[tuple[tuple[np.ndarray, np.ndarray] | None]]] = {}

    def rule_for(self, field: pa.Field) -> tuple[Rule, list[str]]:
        """The rule of column ``field``, and the output keys it adds (``col_lengths``, ...)."""
        t, name = field.type, field.name
        if pa.types.is_dictionary(t):
            inner, added = self.rule_for(pa.field(name, t.value_type))
            return (lambda a, r, n: inner(take(a, r).dictionary_decode(), None, n)), added
        if pa.types.is_run_end_encoded(t):
            inner, added = self.rule_for(pa.field(name, t.value_type))
            return (lambda a, r, n: inner(pc.run_end_decode(take(a, r)), None, n)), added
        numeric_list = (
            pa.types.is_fixed_size_list(t) or pa.types.is_list(t) or pa.types.is_large_list(t)
        ) and is_numeric(t.value_type)
        if self.null_policy == "error" and (
            is_numeric(t) or pa.types.is_boolean(t) or temporal_int(t) is not None or numeric_list
        ):
            self.no_nulls.append(name)
        # Under "mask", a numeric list column adds its rows' validity and its values'.
        list_masks = [f"{name}_valid", f"{name}_values_valid"] if self.null_policy == "mask" else []
        if is_numeric(t) and self.null_policy != "mask":
            # The common case first, in as few steps as possible: small batches paid most of a
            # column's time in checks
            # (docs/adr/0020-measurements-behind-constants.md#converting-rows).
            def plain(a: pa.Array, r: Rows, n: int) -> list[Field]:
                if a.null_count:
                    return self._primitive(name, a, r, n)
                if r is None:
                    return [Field(name, a, (n,))]
                return [Field(name, Gather(numpy_view(a), r), (n,))]

            return plain, []
        if is_numeric(t) or pa.types.is_boolean(t):
            added = [f"{name}_valid"] if self.null_policy == "mask" else []
            return (lambda a, r, n: self._primitive(name, a, r, n)), added
        as_int = temporal_int(t)
        if as_int is not None:
            added = [f"{name}_valid"] if self.null_policy == "mask" else []
            return (lambda a, r, n: self._primitive(name, a.view(as_int), r, n)), added
        if pa.types.is_fixed_size_list(t) and is_numeric(t.value_type):
            size = t.list_size
            return (lambda a, r, n: self._fixed_list(name, a, r, n, size)), list_masks
        if numeric_list:
            if self.list_format == "padded":
                _check_pad_value(name, self.pad_value, t.value_type)
                added = [f"{name}_lengths", *list_masks]
                return (lambda a, r, n: self._padded(name, a, r, n)), added
            if self.list_format == "nested":
                self.nested.append(name)
            added = [f"{name}_offsets", *list_masks]
            return (lambda a, r, n: self._offsets(name, a, r, n)), added
        if pa.types.is_null(t):
            return (lambda a, r, n: [Field(name, [None] * n, None)]), []
        if pa.types.is_string(t) or pa.types.is_binary(t):
            # Kept as Arrow until the last moment: across processes, the transport ships the
            # buffers and the main process makes the list (cheaper than pickling the list).
            return (lambda a, r, n: [Field(name, take(a, r), None)]), []
        # Decimals, structs, maps, nested lists, large strings, views, unions, extension types:
        # Python objects, temporal values inside nested types as their stored integers (as at
        # the top level); extension values as pyarrow gives them (uuid.UUID, ...).
        if pa.types.is_interval(t):  # MonthDayNano objects do not pickle: plain dicts
            return (lambda a, r, n: [Field(name, intervals(take(a, r)), None)]), []
        if holds_interval(t):
            raise UnsupportedTypeError(
                f"column {name!r} ({t}) holds intervals inside a nested type, which have no "
                f'picklable Python value; read it with output_format="arrow"'
            )
        plain = python_type(t)
        if plain == t:
            return (lambda a, r, n: [Field(name, take(a, r).to_pylist(), None)]), []
        return (lambda a, r, n: [Field(name, as_plain(take(a, r), plain).to_pylist(), None)]), []

    # --- per batch ----------------------------------------------------------------------------
    # Each rule gets the column ``array`` and ``rows``: ``None`` (all rows, in order: zero-copy
    # where possible) or the indices of the rows to output, in order. Gathering rows here,
    # straight into the output arrays, replaces a shuffle's separate Arrow ``take`` (which
    # was the slowest step for list columns: ~0.4 M rows/s). Nothing per batch may cost
    # O(len(array)): ``array`` is a whole shuffle block.

    def _nulls(self, name: str, array: pa.Array) -> None:
        raise NullValueError(
            f"column {name!r} holds {array.null_count} null(s) and "
            'null_policy="error"; pass null_policy="fill" or "mask", or filter the nulls out'
        )

    def _primitive(self, name: str, array: pa.Array, rows: Rows, n: int) -> list[Field]:
        if array.null_count or pa.types.is_boolean(array.type):
            if array.null_count and self.null_policy == "error":
                self._nulls(name, array)
            array, rows = take(array, rows), None
        fields: list[Field] = []
        if self.null_policy == "mask":  # the key is there in every batch, nulls or not
            # (No nulls: ``array`` may still be the whole block, not the batch's ``n`` rows.)
            valid = valid_view(array) if array.null_count else np.ones(n, dtype=np.bool_)
            fields.append(Field(f"{name}_valid", valid, (n,)))
        if array.null_count:
            array = pc.fill_null(array, _fill_value(array.type))
        if pa.types.is_boolean(array.type):
            fields.insert(0, Field(name, bool_view(array), (n,)))
        elif rows is None:
            fields.insert(0, Field(name, array, (n,)))
        else:
            fields.insert(0, Field(name, Gather(numpy_view(array), rows), (n,)))
        return fields

    def _fill_list_nulls(self, name: str, values: pa.Array) -> tuple[pa.Array, np.ndarray | None]:
        """``values`` with nulls filled (NaN, 0), and their validity when masking."""
        if self.null_policy == "error":
            self._nulls(name, values)
        valid = valid_view(values)
        filled = pc.fill_null(values, _fill_value(values.type))
        return filled, valid if self.null_policy == "mask" else None

    def _row_mask(self, name: str, array: pa.Array, n: int) -> list[Field]:
        if self.null_policy != "mask":
            return []
        valid = valid_view(array) if array.null_count else np.ones(n, dtype=np.bool_)
        return [Field(f"{name}_valid", valid, (n,))]

    def _fixed_list(self, name: str, array: pa.Array, rows: Rows, n: int, size: int) -> list[Field]:
        if rows is not None and not array.null_count and self.null_policy != "mask":
            block = self._block_values(name, array, size)
            if block is not None:  # (the common case: the block's values viewed once)
                return [Field(name, Gather(block[0], rows), (n, size))]
        if array.null_count and self.null_policy == "error":
            self._nulls(name, array)
        if rows is not None and (
            self.null_policy == "mask" or array.null_count or _flat(array, size).null_count
        ):
            # (Masks and filled values are made for the batch's rows, not the whole block.)
            array, rows = take(array, rows), None
        values = _flat(array, size)  # (a null row's values: zeros, filled below)
        masks: list[Field] = self._row_mask(name, array, n)
        values_valid: np.ndarray | None = None
        if array.null_count:  # a null row's values are filled, like a null value
            values = fixed_values(array, size)
        if values.null_count:
            values, values_valid = self._fill_list_nulls(name, values)
        if self.null_policy == "mask":
            if values_valid is None:
                values_valid = np.ones(len(values), dtype=np.bool_)
            masks.append(Field(f"{name}_values_valid", values_valid.reshape(n, size), (n, size)))
        if rows is None:
            return [Field(name, values, (n, size)), *masks]
        gathered = numpy_view(values).reshape(len(array), size)
        return [Field(name, Gather(gathered, rows), (n, size)), *masks]

    def _list_arrays(
        self, name: str, array: pa.Array, rows: Rows, n: int
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray | None]:
        """Values, start and length of each output row's list in them, and (when masking) the
        values' validity. Without nulls or a mask the values are the whole column's
        (zero-copy); else this batch's values, gathered first, so that filling and masking
        never pass over a whole shuffle block per batch."""
        index = np.arange(n) if rows is None else rows
        if not array.null_count and self.null_policy != "mask":
            block = self._block_values(name, array)
            if block is not None:  # (the common case: the block's values viewed once)
                values_of_block, offsets_of_block = block
                starts = offsets_of_block[index]
                return values_of_block, starts, offsets_of_block[index + 1] - starts, None
        values = array.values  # the whole child: offsets index it even when array is sliced
        offsets = numpy_view(array.offsets)
        starts = offsets[index].astype(np.int64)
        lengths = offsets[index + 1].astype(np.int64) - starts
        if array.null_count:  # a null list is an empty one (its slot's offsets may differ)
            if self.null_policy == "error":
                self._nulls(name, array)
            null = ~valid_view(array)[index]
            lengths[null] = 0
        if not values.null_count and self.null_policy != "mask":
            return numpy_view(values), starts, lengths, None
        begins = np.zeros(n, dtype=np.int64)
        np.cumsum(lengths[:-1], out=begins[1:])
        total = int(lengths.sum())
        taken = values.take(arrow_of(np.repeat(starts - begins, lengths) + np.arange(total)))
        valid = None
        if taken.null_count:
            taken, valid = self._fill_list_nulls(name, taken)
        elif self.null_policy == "mask":
            valid = np.ones(total, dtype=np.bool_)
        return numpy_view(taken), begins, lengths, valid

    def _block_values(
        self, name: str, array: pa.Array, size: int = 0
    ) -> tuple[np.ndarray, np.ndarray] | None:
        """A list column's values as numpy and its offsets as int64 (a fixed-size list's
        values as rows of ``size``, and no offsets), made once for the block ``array`` is a
        column of; None when its values hold nulls. The caller checked its rows hold none."""
        last = self._values.get(name)
        if last is None:
            last = self._values[name] = LastBlock()
        made = last.get(array)
        if made is None:
            if size:  # a fixed-size list
                values = _flat(array, size)
                rows = numpy_view(values).reshape(len(array), size)
                made = (None if values.null_count else (rows, _NO_OFFSETS),)
            else:  # (the whole child: the offsets index it even when the array is sliced)
                values = array.values
                offsets = numpy_view(array.offsets).astype(np.int64)
                made = (None if values.null_count else (numpy_view(values), offsets),)
            last.keep(array, made)
        return made[0]

    @property
    def list_pad(self) -> int | float | None:
        """What pads a list row: ``pad_value`` (``list_format="padded"``), else None."""
        return self.pad_value if self.list_format == "padded" else None

    def list_fields(self, name: str, lists: ListRows | ListParts, n: int) -> list[Field]:
        """A null-free list column's fields, no masks: its ``n`` rows padded to the longest
        and their lengths, or laid end to end and their offsets (``lists.pad``)."""
        if lists.pad is not None:
            return [
                Field(name, lists, lists.shape()),
                Field(f"{name}_lengths", lists.lengths, (n,)),
            ]
        offsets = np.zeros(n + 1, dtype=np.int64)
        np.cumsum(lists.lengths, out=offsets[1:])
        total = int(offsets[-1])
        return [Field(name, lists, (total,)), Field(f"{name}_offsets", offsets, (n + 1,))]

    def _offsets(self, name: str, array: pa.Array, rows: Rows, n: int) -> list[Field]:
        values, starts, lengths, valid = self._list_arrays(name, array, rows, n)
        fields = self.list_fields(name, ListRows(values, starts, lengths), n)
        if valid is not None:
            fields += [
                *self._row_mask(name, take(array, rows), n),
                Field(f"{name}_values_valid", ListRows(valid, starts, lengths), fields[0].shape),
            ]
        return fields

    def _padded(self, name: str, array: pa.Array, rows: Rows, n: int) -> list[Field]:
        values, starts, lengths, valid = self._list_arrays(name, array, rows, n)
        fields = self.list_fields(name, ListRows(values, starts, lengths, self.pad_value), n)
        if valid is not None:
            fields += [
                *self._row_mask(name, take(array, rows), n),
                Field(
                    f"{name}_values_valid", ListRows(valid, starts, lengths, False), fields[0].shape
                ),
            ]
        return fields


# (A fixed-size list column's offsets in `ColumnRules._block_values`: none.)
_NO_OFFSETS = np.zeros(0, np.int64)


def _flat(array: pa.FixedSizeListArray, size: int) -> pa.Array:
    """The values of ``array``'s rows (its slice of the child): what ``flatten()`` gives
    without nulls, in a quarter of its 4 µs a call (through pyarrow's compute), paid each
    batch for a block's whole column."""
    if array.null_count:
        return array.flatten()  # (skips null rows' values, as `fixed_values` expects)
    return array.values.slice(array.offset * size, len(array) * size)
