"""Row filters: validation and the columns a filter reads, without parsing expression strings."""

from __future__ import annotations

from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from ..errors import ColumnNotFoundError, FilterTypeError

__all__ = ["filter_columns"]


def _evaluates(expr: pc.Expression, schema: pa.Schema) -> bool:
    empty = pa.table({f.name: pa.array([], type=f.type) for f in schema})
    try:
        empty.filter(expr)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError):
        return False
    return True


def filter_columns(filters: Any, schema: pa.Schema) -> tuple[str, ...]:
    """Check ``filters`` against ``schema`` and return the columns it references.

    The referenced columns are found by binding the expression to an empty table with each column
    left out in turn: typed and exact, with no parsing of the expression's text.

    Args:
        filters: a ``pyarrow.compute.Expression`` (or ``None``).
        schema: the columns available to the filter (file and partition columns).

    Raises:
        FilterTypeError: ``filters`` is not an Expression.
        ColumnNotFoundError: the filter names a column that is not in ``schema``, or does not
            type-check against it.
    """
    if filters is None:
        return ()
    if not isinstance(filters, pc.Expression):
        raise FilterTypeError(
            f"filters must be a pyarrow.compute.Expression such as pc.field('x') > 0, got "
            f"{type(filters).__name__}; for a list of (column, op, value) tuples use "
            "pyarrow.parquet.filters_to_expression()"
        )
    if not _evaluates(filters, schema):
        try:
            pa.table({f.name: pa.array([], type=f.type) for f in schema}).filter(filters)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError) as exc:
            raise ColumnNotFoundError(
                f"filters {filters} do not apply to the data: {exc}; columns: {schema.names}"
            ) from exc
    return tuple(
        name for i, name in enumerate(schema.names) if not _evaluates(filters, schema.remove(i))
    )
