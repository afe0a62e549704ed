"""`Converter`: a schema's columns converted per batch to the chosen output format, with the
rule `columns.ColumnRules` picks for each column, and the checks the reader runs first
(`Converter.check`, `Problem`). The mapping is in the package docstring.
"""

from __future__ import annotations

from typing import Any, Literal, NamedTuple

import numpy as np
import pyarrow as pa
import torch

from ..errors import DataError, InvalidArgumentError, NullValueError
from .arrow_values import intervals, outside_python, string_arrays, take
from .columns import ColumnRules, Rows, Rule, is_numeric
from .fields import Field, as_numpy, as_tensor
from .last_block import LastBlock
from .lists import list_parts
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
    "check_output",
]

OutputFormat = Literal["torch", "numpy", "arrow", "dict"]
ListFormat = Literal["padded", "offsets", "nested"]
NullPolicy = Literal["error", "fill", "mask"]
OUTPUT_FORMATS: tuple[OutputFormat, ...] = ("torch", "numpy", "arrow", "dict")
LIST_FORMATS: tuple[ListFormat, ...] = ("padded", "offsets", "nested")
NULL_POLICIES: tuple[NullPolicy, ...] = ("error", "fill", "mask")

# Batches of fewer rows than this (the block's first) gather from a block left in parts
# through joined columns (see `Converter._fields_of_parts`; the stream leaves blocks in parts
# only for batches this large, `stream.blocks.BLOCK_PARTS_MIN_BATCH`).
_GATHER_ROWS = 128
_LISTS = (pa.ListArray, pa.LargeListArray, pa.FixedSizeListArray)


class Problem(NamedTuple):
    """Why a batch cannot be converted (`Converter.check`): the class to raise, the reason,
    and the column at fault. The reader raises it naming the file and rows, and what the
    format can tell of the column's values (`Format.null_origin`)."""

    error: type[DataError]
    reason: str
    column: str


def check_output(output_format: str, list_format: str, null_policy: str) -> None:
    """Refuse conversion options with unknown values, or that do not go together.

    Raises:
        InvalidArgumentError: an option has an unknown value, or ``list_format="nested"``
            without torch output.
    """
    for name, value, allowed in (
        ("output_format", output_format, OUTPUT_FORMATS),
        ("list_format", list_format, LIST_FORMATS),
        ("null_policy", null_policy, NULL_POLICIES),
    ):
        if value not in allowed:
            raise InvalidArgumentError(f"{name} must be one of {allowed}, got {value!r}")
    if list_format == "nested" and output_format != "torch":
        raise InvalidArgumentError('list_format="nested" needs output_format="torch"')


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
        check_output(output_format, list_format, null_policy)
        self.schema = schema
        self.output_format = output_format
        self.list_format = list_format
        self.null_policy = null_policy
        self.pad_value = pad_value
        self._rules: list[tuple[str, Rule]] = []
        column_rules = self._column_rules = ColumnRules(list_format, null_policy, pad_value)
        # The columns of the record batch converted last, by name: small batches are cut from
        # one shuffle block thousands of times, each paying for its wrappers otherwise
        # (docs/adr/0020-measurements-behind-constants.md#converting-rows).
        self._columns: LastBlock[dict[str, pa.Array]] = LastBlock()
        # The same for a shuffle block left in parts (a table; see `BlockParts`).
        self._parts: LastBlock[BlockParts] = LastBlock()
        # Columns gathered straight from a block's parts: their row width (0: one value;
        # else a fixed-size list's size). The others are joined once per block.
        self._gathered: dict[str, int] = {}
        # ... and the variable-length list columns gathered from the parts' own values.
        self._listed: tuple[str, ...] = ()
        # Numeric columns that small batches take from a block's `Stacks`, by type; and the
        # stacks of the block converted last.
        self._stack_groups: list[list[str]] = []
        self._stacks: LastBlock[Stacks] = LastBlock()
        self._nested = column_rules.nested  # (both filled by rule_for, below)
        self._no_nulls = column_rules.no_nulls  # columns whose nulls are an error (see check)
        # Columns some of whose values become Python objects (strings checked to be UTF-8),
        # and top-level temporal columns ("dict" output makes them datetime objects).
        self._python_columns = [
            f.name for f in schema if not (is_numeric(f.type) or pa.types.is_boolean(f.type))
        ]
        self._intervals = [f.name for f in schema if pa.types.is_interval(f.type)]
        self._datetime_columns = [
            f.name for f in schema if pa.types.is_timestamp(f.type) or pa.types.is_date(f.type)
        ]
        if output_format in ("torch", "numpy"):
            keys: set[str] = set(schema.names)
            for field in schema:
                rule, added = column_rules.rule_for(field)
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
                if is_numeric(t):
                    self._gathered[field.name] = 0
                elif pa.types.is_fixed_size_list(t) and is_numeric(t.value_type):
                    self._gathered[field.name] = t.list_size
                elif (pa.types.is_list(t) or pa.types.is_large_list(t)) and is_numeric(
                    t.value_type
                ):
                    self._listed += (field.name,)
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

    # --- per batch ----------------------------------------------------------------------------

    def check(self, batch: pa.RecordBatch) -> Problem | None:
        """Why rows of ``batch`` cannot be converted (the error to raise, its reason and the
        column), or None: nulls this converter refuses (`NullValueError`),
        strings that are not UTF-8 (they become Python ``str``), dates and times outside
        Python's range (``"dict"`` output makes them ``datetime``).

        Checked by the reader, where the file and rows are known, so the error names them.
        """
        # Each column's position, once: each access to the names builds their list
        # (docs/adr/0020-measurements-behind-constants.md#converting-rows).
        at = {name: i for i, name in enumerate(batch.schema.names)}
        for name in self._no_nulls:
            i = at.get(name)
            if i is None:
                continue
            column = batch.column(i)  # (by position: by name, it is looked up again)
            if column.null_count or (isinstance(column, _LISTS) and column.flatten().null_count):
                return Problem(
                    NullValueError,
                    f'column {name!r} holds nulls and null_policy="error"; pass '
                    'null_policy="fill" or "mask", or filter the nulls out',
                    name,
                )
        if self.output_format == "arrow":
            return None
        for name in self._python_columns:
            if name not in at:
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
                if name in at:
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
        nulls are gathered from the parts (`GatherParts`), numeric list columns without nulls
        from the parts' values (`ListParts`); any other column is joined once per block (as a
        block read in more parts is) and converted as usual."""
        if rows is None:
            rows = np.arange(table.num_rows)
        n = len(rows)
        parts = self._parts.get(table)
        if parts is None:
            # Small batches join every column once per block instead: they gather faster from
            # joined columns (docs/adr/0020-measurements-behind-constants.md#blocks-left-in-parts).
            big = n >= _GATHER_ROWS
            gathered, listed = (self._gathered, self._listed) if big else ({}, ())
            parts = self._parts.keep(table, BlockParts(table, gathered, listed))
        picks: Picks | None = None
        out: list[Field] = []
        for name, rule in self._rules:
            arrays = parts.arrays.get(name)
            if arrays is None:
                lists = parts.lists.get(name)
                if lists is None:
                    out.extend(rule(parts.joined(name), rows, n))
                    continue
                if picks is None:
                    picks = Picks(parts.starts, rows)
                rows_of = list_parts(*lists, picks.parts, n, self._column_rules.list_pad)
                out.extend(self._column_rules.list_fields(name, rows_of, n))
                continue
            if picks is None:
                picks = Picks(parts.starts, rows)
            size = self._gathered[name]
            out.append(Field(name, GatherParts(arrays, picks), (n, size) if size else (n,)))
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
