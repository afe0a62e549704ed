"""One conversion rule per column, decided from the schema: `Converter` (the mapping is in the
package docstring). One class, ~430 lines: its rules share the converter's options.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Literal, NamedTuple, TypeAlias

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import torch

from ..arrow_values import (
    as_plain,
    holds_interval,
    intervals,
    outside_python,
    python_type,
    string_arrays,
    take,
    temporal_int,
)
from ..errors import DataError, InvalidArgumentError, NullValueError, UnsupportedTypeError
from .fields import Field, Gather, as_numpy, as_tensor
from .last_block import LastBlock
from .lists import ListRows, fixed_values
from .parts import BlockParts, GatherParts, Picks
from .stacks import STACK_ROWS, Stacks

__all__ = [
    "LIST_FORMATS",
    "NULL_POLICIES",
    "OUTPUT_FORMATS",
    "Converter",
    "ListFormat",
    "NullPolicy",
    "OutputFormat",
    "Problem",
]

OutputFormat = Literal["torch", "numpy", "arrow", "dict"]
ListFormat = Literal["padded", "offsets", "nested"]
NullPolicy = Literal["error", "fill", "mask"]
OUTPUT_FORMATS: tuple[OutputFormat, ...] = ("torch", "numpy", "arrow", "dict")
LIST_FORMATS: tuple[ListFormat, ...] = ("padded", "offsets", "nested")
NULL_POLICIES: tuple[NullPolicy, ...] = ("error", "fill", "mask")

Rows: TypeAlias = "np.ndarray | None"

# Batches of fewer rows than this (the block's first) gather from a block left in parts
# through joined columns (see `Converter._fields_of_parts`; the stream leaves blocks in parts
# only for batches this large, `stream.blocks.BLOCK_PARTS_MIN_BATCH`).
_GATHER_ROWS = 128


def _is_numeric(t: pa.DataType) -> bool:
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


def _fill_value(t: pa.DataType) -> Any:
    if pa.types.is_floating(t):
        return float("nan")
    if pa.types.is_boolean(t):
        return False
    return 0


_Rule = Callable[[pa.Array, "np.ndarray | None", int], list[Field]]


class Problem(NamedTuple):
    """Why a batch cannot be converted (`Converter.check`): the class to raise, the reason,
    and the column at fault. The reader raises it naming the file and rows, and what the
    format can tell of the column's values (`Format.null_origin`)."""

    error: type[DataError]
    reason: str
    column: str


class Converter:
    """Converts Arrow record batches of one schema to the chosen output format.

    Args:
        schema: the schema of the batches.
        output_format: ``"torch"``, ``"numpy"``, ``"arrow"`` or ``"dict"``.
        list_format: how variable-length numeric lists become tensors.
        null_policy: what nulls in numeric columns do.
        pad_value: the padding value of ``list_format="padded"``.

    Raises:
        InvalidArgumentError: an option has an unknown value, or an added key (``col_lengths``,
            ``col_offsets``, ``col_valid``) collides with a column.
        UnsupportedTypeError: a column's type has no mapping.
    """

    def __init__(
        self,
        schema: pa.Schema,
        *,
        output_format: OutputFormat = "torch",
        list_format: ListFormat = "padded",
        null_policy: NullPolicy = "error",
        pad_value: int | float = 0,
    ) -> None:
        for name, value, allowed in (
            ("output_format", output_format, OUTPUT_FORMATS),
            ("list_format", list_format, LIST_FORMATS),
            ("null_policy", null_policy, NULL_POLICIES),
        ):
            if value not in allowed:
                raise InvalidArgumentError(f"{name} must be one of {allowed}, got {value!r}")
        if list_format == "nested" and output_format != "torch":
            raise InvalidArgumentError('list_format="nested" needs output_format="torch"')
        self.schema = schema
        self.output_format = output_format
        self.list_format = list_format
        self.null_policy = null_policy
        self.pad_value = pad_value
        self._rules: list[tuple[str, _Rule]] = []
        # The columns of the record batch converted last, by name: small batches are cut from
        # one shuffle block thousands of times, and making 9 columns' wrappers costs ~12 µs.
        self._columns: LastBlock[dict[str, pa.Array]] = LastBlock()
        # The same for a shuffle block left in parts (a table; see `BlockParts`).
        self._parts: LastBlock[BlockParts] = LastBlock()
        # Columns gathered straight from a block's parts: their row width (0: one value;
        # else a fixed-size list's size). The others are joined once per block.
        self._gathered: dict[str, int] = {}
        # Numeric columns that small batches take from a block's `Stacks`, by type; and the
        # stacks of the block converted last.
        self._stack_groups: list[list[str]] = []
        self._stacks: LastBlock[Stacks] = LastBlock()
        self._nested: list[str] = []
        self._no_nulls: list[str] = []  # columns whose nulls are an error (see check)
        # Columns some of whose values become Python objects (strings checked to be UTF-8),
        # and top-level temporal columns ("dict" output makes them datetime objects).
        self._python_columns = [
            f.name for f in schema if not (_is_numeric(f.type) or pa.types.is_boolean(f.type))
        ]
        self._intervals = [f.name for f in schema if pa.types.is_interval(f.type)]
        self._datetime_columns = [
            f.name for f in schema if pa.types.is_timestamp(f.type) or pa.types.is_date(f.type)
        ]
        if output_format in ("torch", "numpy"):
            keys: set[str] = set(schema.names)
            for field in schema:
                rule, added = self._rule_for(field)
                for key in added:
                    if key in keys:
                        raise InvalidArgumentError(
                            f"column {field.name!r} adds the output key {key!r}, which is also "
                            "a column; rename or drop one of them"
                        )
                    keys.add(key)
                self._rules.append((field.name, rule))
                t = field.type
                if null_policy == "mask":
                    continue  # (masks come from the rules)
                if _is_numeric(t):
                    self._gathered[field.name] = 0
                elif pa.types.is_fixed_size_list(t) and _is_numeric(t.value_type):
                    self._gathered[field.name] = t.list_size
            by_type: dict[pa.DataType, list[str]] = {}
            for name, width in self._gathered.items():
                if not width:
                    by_type.setdefault(self.schema.field(name).type, []).append(name)
            self._stack_groups = list(by_type.values())

    def __getstate__(self) -> dict[str, Any]:
        # Rules are closures; rebuild them from the arguments in the receiving process.
        return {
            "schema": self.schema,
            "output_format": self.output_format,
            "list_format": self.list_format,
            "null_policy": self.null_policy,
            "pad_value": self.pad_value,
        }

    def __setstate__(self, state: dict[str, Any]) -> None:
        schema = state.pop("schema")
        self.__init__(schema, **state)  # type: ignore[misc]

    # --- planning: one rule per column --------------------------------------------------------

    def _rule_for(self, field: pa.Field) -> tuple[_Rule, list[str]]:
        t, name = field.type, field.name
        if pa.types.is_dictionary(t):
            inner, added = self._rule_for(pa.field(name, t.value_type))
            return (lambda a, r, n: inner(take(a, r).dictionary_decode(), None, n)), added
        if pa.types.is_run_end_encoded(t):
            inner, added = self._rule_for(pa.field(name, t.value_type))
            return (lambda a, r, n: inner(pc.run_end_decode(take(a, r)), None, n)), added
        numeric_list = (
            pa.types.is_fixed_size_list(t) or pa.types.is_list(t) or pa.types.is_large_list(t)
        ) and _is_numeric(t.value_type)
        if self.null_policy == "error" and (
            _is_numeric(t) or pa.types.is_boolean(t) or temporal_int(t) is not None or numeric_list
        ):
            self._no_nulls.append(name)
        # Under "mask", a numeric list column adds its rows' validity and its values'.
        list_masks = [f"{name}_valid", f"{name}_values_valid"] if self.null_policy == "mask" else []
        if _is_numeric(t) and self.null_policy != "mask":
            # The common case first, in as few steps as possible: small batches paid most of a
            # column's time in checks
            # (docs/adr/0020-measurements-behind-constants.md#converting-rows).
            def plain(a: pa.Array, r: Rows, n: int) -> list[Field]:
                if a.null_count:
                    return self._primitive(name, a, r, n)
                if r is None:
                    return [Field(name, a, (n,))]
                return [Field(name, Gather(a.to_numpy(zero_copy_only=True), r), (n,))]

            return plain, []
        if _is_numeric(t) or pa.types.is_boolean(t):
            added = [f"{name}_valid"] if self.null_policy == "mask" else []
            return (lambda a, r, n: self._primitive(name, a, r, n)), added
        as_int = temporal_int(t)
        if as_int is not None:
            added = [f"{name}_valid"] if self.null_policy == "mask" else []
            return (lambda a, r, n: self._primitive(name, a.view(as_int), r, n)), added
        if pa.types.is_fixed_size_list(t) and _is_numeric(t.value_type):
            size = t.list_size
            return (lambda a, r, n: self._fixed_list(name, a, r, n, size)), list_masks
        if numeric_list:
            if self.list_format == "padded":
                _check_pad_value(name, self.pad_value, t.value_type)
                added = [f"{name}_lengths", *list_masks]
                return (lambda a, r, n: self._padded(name, a, r, n)), added
            if self.list_format == "nested":
                self._nested.append(name)
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
            valid = (
                array.is_valid().to_numpy(zero_copy_only=False)
                if array.null_count
                else np.ones(n, dtype=np.bool_)
            )
            fields.append(Field(f"{name}_valid", valid, (n,)))
        if array.null_count:
            array = pc.fill_null(array, pa.scalar(_fill_value(array.type), array.type))
        if pa.types.is_boolean(array.type):
            fields.insert(0, Field(name, array.to_numpy(zero_copy_only=False), (n,)))
        elif rows is None:
            fields.insert(0, Field(name, array, (n,)))
        else:
            fields.insert(0, Field(name, Gather(array.to_numpy(zero_copy_only=True), rows), (n,)))
        return fields

    def _fill_list_nulls(self, name: str, values: pa.Array) -> tuple[pa.Array, np.ndarray | None]:
        """``values`` with nulls filled (NaN, 0), and their validity when masking."""
        if self.null_policy == "error":
            self._nulls(name, values)
        valid = values.is_valid().to_numpy(zero_copy_only=False)
        filled = pc.fill_null(values, pa.scalar(_fill_value(values.type), values.type))
        return filled, valid if self.null_policy == "mask" else None

    def _row_mask(self, name: str, array: pa.Array, n: int) -> list[Field]:
        if self.null_policy != "mask":
            return []
        valid = (
            array.is_valid().to_numpy(zero_copy_only=False)
            if array.null_count
            else np.ones(n, dtype=np.bool_)
        )
        return [Field(f"{name}_valid", valid, (n,))]

    def _fixed_list(self, name: str, array: pa.Array, rows: Rows, n: int, size: int) -> list[Field]:
        if array.null_count and self.null_policy == "error":
            self._nulls(name, array)
        if rows is not None and (
            self.null_policy == "mask" or array.null_count or array.flatten().null_count
        ):
            # (Masks and filled values are made for the batch's rows, not the whole block.)
            array, rows = take(array, rows), None
        values = array.flatten()  # .values would ignore the slice offset; nulls: zeros
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
        source = values.to_numpy(zero_copy_only=True).reshape(len(array), size)
        return [Field(name, Gather(source, rows), (n, size)), *masks]

    def _list_parts(
        self, name: str, array: pa.Array, rows: Rows, n: int
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray | None]:
        """Values, start and length of each output row's list in them, and (when masking) the
        values' validity. Without nulls or a mask the values are the whole column's
        (zero-copy); else this batch's values, gathered first, so that filling and masking
        never pass over a whole shuffle block per batch."""
        values = array.values  # the whole child: offsets index it even when array is sliced
        offsets = array.offsets.to_numpy()
        index = np.arange(n) if rows is None else rows
        starts = offsets[index].astype(np.int64)
        lengths = offsets[index + 1].astype(np.int64) - starts
        if array.null_count:  # a null list is an empty one (its slot's offsets may differ)
            if self.null_policy == "error":
                self._nulls(name, array)
            null = ~array.is_valid().to_numpy(zero_copy_only=False)[index]
            lengths[null] = 0
        if not values.null_count and self.null_policy != "mask":
            return values.to_numpy(zero_copy_only=True), starts, lengths, None
        begins = np.zeros(n, dtype=np.int64)
        np.cumsum(lengths[:-1], out=begins[1:])
        total = int(lengths.sum())
        taken = values.take(pa.array(np.repeat(starts - begins, lengths) + np.arange(total)))
        valid = None
        if taken.null_count:
            taken, valid = self._fill_list_nulls(name, taken)
        elif self.null_policy == "mask":
            valid = np.ones(total, dtype=np.bool_)
        return taken.to_numpy(zero_copy_only=True), begins, lengths, valid

    def _offsets(self, name: str, array: pa.Array, rows: Rows, n: int) -> list[Field]:
        values, starts, lengths, valid = self._list_parts(name, array, rows, n)
        offsets = np.zeros(n + 1, dtype=np.int64)
        np.cumsum(lengths, out=offsets[1:])
        total = int(offsets[-1])
        fields = [
            Field(name, ListRows(values, starts, lengths), (total,)),
            Field(f"{name}_offsets", offsets, (n + 1,)),
        ]
        if valid is not None:
            fields += [
                *self._row_mask(name, take(array, rows), n),
                Field(f"{name}_values_valid", ListRows(valid, starts, lengths), (total,)),
            ]
        return fields

    def _padded(self, name: str, array: pa.Array, rows: Rows, n: int) -> list[Field]:
        values, starts, lengths, valid = self._list_parts(name, array, rows, n)
        padded = ListRows(values, starts, lengths, self.pad_value)
        shape = padded.shape()
        fields = [Field(name, padded, shape), Field(f"{name}_lengths", lengths, (n,))]
        if valid is not None:
            fields += [
                *self._row_mask(name, take(array, rows), n),
                Field(f"{name}_values_valid", ListRows(valid, starts, lengths, False), shape),
            ]
        return fields

    def check(self, batch: pa.RecordBatch) -> Problem | None:
        """Why rows of ``batch`` cannot be converted (the error to raise, its reason and the
        column), or None: nulls this converter refuses (`NullValueError`),
        strings that are not UTF-8 (they become Python ``str``), dates and times outside
        Python's range (``"dict"`` output makes them ``datetime``).

        Checked by the reader, where the file and rows are known, so the error names them.
        """
        names = set(batch.schema.names)  # (once: each access builds the list, ~4 µs)
        for name in self._no_nulls:
            if name not in names:
                continue
            column = batch.column(name)
            is_list = isinstance(column, pa.ListArray | pa.LargeListArray | pa.FixedSizeListArray)
            if column.null_count or (is_list and column.flatten().null_count):
                return Problem(
                    NullValueError,
                    f'column {name!r} holds nulls and null_policy="error"; pass '
                    'null_policy="fill" or "mask", or filter the nulls out',
                    name,
                )
        if self.output_format == "arrow":
            return None
        for name in self._python_columns:
            if name not in names:
                continue
            try:
                for strings in string_arrays(batch.column(name)):
                    strings.validate(full=True)  # on a string array: its offsets and UTF-8
            except pa.ArrowInvalid as exc:
                return Problem(
                    DataError,
                    f"column {name!r} holds strings that are not UTF-8 ({exc}), which Python "
                    'str cannot hold; read it with output_format="arrow", or as binary',
                    name,
                )
        if self.output_format == "dict":
            for name in self._datetime_columns:
                if name in names:
                    reason = outside_python(name, batch.column(name))
                    if reason is not None:
                        return Problem(DataError, reason, name)
        return None

    def fields(self, batch: pa.RecordBatch | pa.Table, rows: Rows = None) -> list[Field]:
        """The converted fields of ``batch`` (torch/numpy output formats).

        Args:
            batch: the record batch, or a shuffle block left in parts (a table).
            rows: indices of the rows to convert, in output order (``None``: all, in order).
        """
        if isinstance(batch, pa.Table):
            return self._fields_of_parts(batch, rows)
        n = batch.num_rows if rows is None else len(rows)
        columns = self._columns_of(batch)
        out: list[Field] = []
        for name, rule in self._rules:
            out.extend(rule(columns[name], rows, n))
        return out

    def _columns_of(self, batch: pa.RecordBatch) -> dict[str, pa.Array]:
        columns = self._columns.get(batch)
        if columns is None:
            columns = dict(zip(batch.schema.names, batch.columns, strict=True))
            self._columns.keep(batch, columns)
        return columns

    def _fields_of_parts(self, table: pa.Table, rows: Rows) -> list[Field]:
        """`fields` of a block left in parts: numeric and fixed-size list columns without
        nulls are gathered from the parts (`GatherParts`); any other column is joined once per
        block (as a block read in more parts is) and converted as usual."""
        if rows is None:
            rows = np.arange(table.num_rows)
        n = len(rows)
        parts = self._parts.get(table)
        if parts is None:
            # Small batches join every column once per block instead: they gather faster from
            # joined columns (docs/adr/0020-measurements-behind-constants.md#blocks-left-in-parts).
            gathered = self._gathered if n >= _GATHER_ROWS else {}
            parts = self._parts.keep(table, BlockParts(table, gathered))
        picks: Picks | None = None
        out: list[Field] = []
        for name, rule in self._rules:
            sources = parts.sources.get(name)
            if sources is None:
                out.extend(rule(parts.joined(name), rows, n))
                continue
            if picks is None:
                picks = Picks(parts.starts, rows)
            size = self._gathered[name]
            out.append(Field(name, GatherParts(sources, picks), (n, size) if size else (n,)))
        return out

    def finish_torch(self, batch: dict[str, Any]) -> dict[str, Any]:
        """Build nested tensors from values and offsets (``list_format="nested"``)."""
        for name in self._nested:
            offsets = batch.pop(f"{name}_offsets")
            lengths = offsets[1:] - offsets[:-1]
            batch[name] = torch.nested.nested_tensor_from_jagged(
                batch[name], offsets, max_seqlen=int(lengths.max()) if len(lengths) else 0
            )
        return batch

    def __call__(self, batch: pa.RecordBatch | pa.Table, rows: Rows = None) -> Any:
        """Convert rows ``rows`` (``None``: all) of one record batch (or a shuffle block left
        in parts, a table) to the output format."""
        if self.output_format == "arrow":
            return take(batch, rows)
        if self.output_format == "dict":
            out = take(batch, rows).to_pydict()
            for name in self._intervals:  # MonthDayNano objects do not pickle
                out[name] = intervals(
                    batch.column(name) if rows is None else take(batch.column(name), rows)
                )
            return out
        if (
            self._stack_groups
            and rows is not None
            and len(rows) < STACK_ROWS
            and isinstance(batch, pa.RecordBatch)
        ):
            return self._stacked(batch, rows)
        fields = self.fields(batch, rows)
        if self.output_format == "numpy":
            return {f.key: as_numpy(f) for f in fields}
        return self.finish_torch({f.key: as_tensor(f) for f in fields})

    def _stacked(self, batch: pa.RecordBatch, rows: np.ndarray) -> dict[str, Any]:
        """`__call__` of a small batch: its numeric columns taken from the block's stacks."""
        stacks = self._stacks.get(batch)
        if stacks is None:
            stacks = self._stacks.keep(batch, Stacks(batch, self._stack_groups))
        tensors = self.output_format == "torch"
        out = stacks.take(rows, tensors=tensors)
        convert = as_tensor if tensors else as_numpy
        columns = self._columns_of(batch)
        n = len(rows)
        ordered: dict[str, Any] = {}
        for name, rule in self._rules:  # (in the columns' order)
            value = out.get(name)
            if value is not None:
                ordered[name] = value
                continue
            for field in rule(columns[name], rows, n):
                ordered[field.key] = convert(field)
        return self.finish_torch(ordered) if tensors else ordered
