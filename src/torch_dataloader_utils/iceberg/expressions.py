"""Row filters for Iceberg reads: pyarrow expressions and pyiceberg expressions, both ways.

``filters=`` of an Iceberg read may be a ``pyarrow.compute.Expression``, a pyiceberg
``BooleanExpression`` or a string in pyiceberg's filter syntax. The reader filters rows with a
pyarrow expression; pyiceberg's scan planning prunes partitions and files with an Iceberg one. Both
directions are typed, and no expression text is ever parsed or printed here:

* pyarrow -> pyiceberg (`from_arrow`) walks the expression's Substrait form
  (``Expression.to_substrait``) and is *conservative*: the Iceberg expression keeps every row
  the pyarrow expression keeps, and more where a part cannot be expressed in Iceberg (that part
  becomes ``AlwaysTrue``). The result says whether the conversion is exact.
* pyiceberg -> pyarrow binds the expression to the table's Iceberg schema and uses pyiceberg's own
  visitor (``pyiceberg.io.pyarrow.expression_to_pyarrow``); strings go through
  ``pyiceberg.expressions.parser.parse`` first.

Semantics are SQL's three-valued logic, as in ``pa.Table.filter``: a row is kept when the filter is
true, not when it is false or null. ``x != 1``, ``x < 1`` and ``is_nan(x)`` are null for a null
``x``; ``is_in`` and ``is_null`` never are; comparisons with NaN are false except ``!=``.
"""

from __future__ import annotations

from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from pyiceberg.expressions import AlwaysTrue, BooleanExpression
from pyiceberg.expressions.parser import parse
from pyiceberg.expressions.visitors import bind
from pyiceberg.io.pyarrow import expression_to_pyarrow, schema_to_pyarrow
from pyiceberg.schema import Schema
from pyparsing import ParseBaseException

from ..errors import ColumnNotFoundError, FilterTypeError, InvalidArgumentError
from .from_arrow import IcebergFilter, arrow_to_iceberg

__all__ = ["IcebergFilter", "arrow_to_iceberg", "iceberg_to_arrow", "normalize_filter"]


# --- pyiceberg -> pyarrow -----------------------------------------------------------------------


def _parse(filters: str) -> BooleanExpression:
    try:
        return parse(filters)
    except ParseBaseException as exc:
        raise InvalidArgumentError(
            f"filters {filters!r} is not in pyiceberg's filter syntax (column {exc.col}): "
            "write e.g. \"x > 0 and name = 'a'\", or pass a pyiceberg or pyarrow expression"
        ) from exc


def _bind_to_arrow(
    expression: BooleanExpression, schema: Schema, case_sensitive: bool
) -> pc.Expression:
    """Bind ``expression`` to ``schema`` and convert it with pyiceberg's visitor.

    The one place that uses pyiceberg's binding and Arrow conversion (all public names:
    ``pyiceberg.expressions.visitors.bind`` and ``pyiceberg.io.pyarrow.expression_to_pyarrow``;
    the latter calls private helpers of its own module, hence the ``pyiceberg<0.13`` pin).
    """
    try:
        bound = bind(schema, expression, case_sensitive=case_sensitive)
    except (ValueError, TypeError) as exc:
        raise ColumnNotFoundError(
            f"filters {expression} do not apply to the table: {exc}; "
            f"columns: {[field.name for field in schema.fields]}"
        ) from exc
    return expression_to_pyarrow(bound, schema)


def iceberg_to_arrow(
    expression: BooleanExpression | str, schema: Schema, *, case_sensitive: bool = True
) -> pc.Expression:
    """Convert a pyiceberg expression (or filter string) to a pyarrow expression to filter rows.

    Args:
        expression: an unbound pyiceberg expression, or a string in pyiceberg's filter syntax.
        schema: the table's Iceberg schema; struct fields come out as nested field references.
        case_sensitive: match column names case-sensitively, as pyiceberg's scans do by default.

    Raises:
        InvalidArgumentError: the string is not in pyiceberg's filter syntax.
        ColumnNotFoundError: the expression names a column that is not in ``schema``, or a literal
            that does not convert to its column's type.
    """
    if isinstance(expression, str):
        expression = _parse(expression)
    return _bind_to_arrow(expression, schema, case_sensitive)


# --- both -----------------------------------------------------------------------------------------


def _arrow_schema(schema: Schema) -> pa.Schema:
    return schema_to_pyarrow(schema, include_field_ids=False)


def _binds(expression: BooleanExpression, schema: Schema, case_sensitive: bool) -> bool:
    try:
        bind(schema, expression, case_sensitive=case_sensitive)
    except (ValueError, TypeError):
        return False
    return True


def normalize_filter(
    filters: Any, table_schema: Schema, *, case_sensitive: bool = True
) -> tuple[pc.Expression | None, BooleanExpression]:
    """Both forms of an Iceberg read's ``filters``: pyarrow to filter rows, pyiceberg to prune.

    A pyarrow expression filters rows as given, and converts (conservatively, see
    `arrow_to_iceberg`) to the pyiceberg expression. A pyiceberg expression or string is used as
    given for pruning and converted exactly, by pyiceberg, to the pyarrow expression.

    Args:
        filters: ``None``, a ``pyarrow.compute.Expression``, an unbound pyiceberg
            ``BooleanExpression``, or a string in pyiceberg's filter syntax
            (``"x > 0 and y = 'a'"``).
        table_schema: the table's Iceberg schema.
        case_sensitive: match column names of pyiceberg expressions case-sensitively.

    Returns:
        ``(arrow_filter, iceberg_filter)``: the pyarrow expression, or None when no row is
        filtered out, and the unbound pyiceberg expression (``AlwaysTrue()`` for no filter).

    Raises:
        FilterTypeError: ``filters`` is of another type.
        InvalidArgumentError: a string that is not in pyiceberg's filter syntax.
        ColumnNotFoundError: the filter names a column the table lacks, or does not type-check.
    """
    if filters is None:
        return None, AlwaysTrue()
    if isinstance(filters, pc.Expression):
        arrow_schema = _arrow_schema(table_schema)
        empty = pa.table({field.name: pa.array([], type=field.type) for field in arrow_schema})
        try:
            empty.filter(filters)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError) as exc:
            raise ColumnNotFoundError(
                f"filters {filters} do not apply to the table: {exc}; columns: {arrow_schema.names}"
            ) from exc
        iceberg = arrow_to_iceberg(filters, arrow_schema).expression
        # Every name came from the schema; binding can only fail on a conversion bug, and pruning
        # nothing is always safe.
        if not _binds(iceberg, table_schema, case_sensitive):
            iceberg = AlwaysTrue()
        return filters, iceberg
    if isinstance(filters, str):
        filters = _parse(filters)
    if isinstance(filters, BooleanExpression):
        arrow = iceberg_to_arrow(filters, table_schema, case_sensitive=case_sensitive)
        return (None if isinstance(filters, AlwaysTrue) else arrow), filters
    raise FilterTypeError(
        "filters must be a pyarrow.compute.Expression (pc.field('x') > 0), a pyiceberg "
        "BooleanExpression (GreaterThan('x', 0)) or a string in pyiceberg's filter syntax "
        f'("x > 0"), got {type(filters).__name__}; for a list of (column, op, value) tuples use '
        "pyarrow.parquet.filters_to_expression()"
    )
