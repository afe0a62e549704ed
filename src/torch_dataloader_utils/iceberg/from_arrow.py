"""pyarrow filter expressions to pyiceberg ones, through their Substrait form.

The walk is typed (the Substrait protobuf messages pyarrow writes) and *conservative*: the
Iceberg expression keeps every row the pyarrow expression keeps, and more where a part cannot be
expressed in Iceberg (that part becomes ``AlwaysTrue``). Negations are pushed down to the
predicates (De Morgan holds in three-valued logic), so a ``NOT`` never wraps an approximation.
See `expressions` for the semantics and the other direction; `literals` converts the values.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, NamedTuple

import pyarrow as pa
import pyarrow.compute as pc
from pyiceberg.expressions import (
    AlwaysFalse,
    AlwaysTrue,
    And,
    BooleanExpression,
    EqualTo,
    GreaterThan,
    GreaterThanOrEqual,
    In,
    IsNaN,
    IsNull,
    LessThan,
    LessThanOrEqual,
    NotEqualTo,
    NotIn,
    NotNaN,
    NotNull,
    NotStartsWith,
    Or,
    Reference,
    StartsWith,
)
from pyiceberg.expressions.literals import (
    BooleanLiteral,
    DoubleLiteral,
    FloatLiteral,
    Literal,
)
from substrait import (  # type: ignore[import-untyped, unused-ignore]
    algebra_pb2,
    extended_expression_pb2,
)

from ..errors import FilterTypeError
from .literals import Special, UnconvertibleError, iceberg_literal

__all__ = ["IcebergFilter", "arrow_to_iceberg"]


class IcebergFilter(NamedTuple):
    """A pyiceberg expression converted from a pyarrow one.

    Attributes:
        expression: an unbound pyiceberg expression that keeps every row the pyarrow expression
            keeps (and possibly more): safe for partition and file pruning.
        exact: the expression keeps exactly the rows the pyarrow expression keeps, so filtering
            rows with either is the same.
    """

    expression: BooleanExpression
    exact: bool


# --- pyarrow -> pyiceberg, through Substrait ----------------------------------------------------

# Substrait names (and pyarrow's, in case a producer keeps them) of the functions converted.
_AND = frozenset({"and", "and_kleene"})
_OR = frozenset({"or", "or_kleene"})
_NOT = frozenset({"not", "invert"})
_COMPARISONS = {
    "equal": "equal",
    "not_equal": "not_equal",
    "lt": "lt",
    "less": "lt",
    "lte": "lte",
    "less_equal": "lte",
    "gt": "gt",
    "greater": "gt",
    "gte": "gte",
    "greater_equal": "gte",
}
_IS_NULL = frozenset({"is_null"})
_IS_NOT_NULL = frozenset({"is_not_null", "is_valid"})
_IS_NAN = frozenset({"is_nan"})
_STARTS_WITH = frozenset({"starts_with"})

# ``literal <op> field`` is ``field <flipped op> literal``.
_FLIPPED = {
    "equal": "equal",
    "not_equal": "not_equal",
    "lt": "gt",
    "lte": "gte",
    "gt": "lt",
    "gte": "lte",
}
# Rows where ``field <op> literal`` is false (not null) are those where ``field <negated op>
# literal`` is true, except NaN, which makes every ordering comparison false.
_NEGATED = {
    "equal": "not_equal",
    "not_equal": "equal",
    "lt": "gte",
    "lte": "gt",
    "gt": "lte",
    "gte": "lt",
}

_Result = tuple[BooleanExpression, bool]


def _plain_field(field: pa.Field) -> pa.Field:
    """``field`` without metadata, its type with large, view and dictionary types made plain.

    Substrait has no large or view types and no field metadata (pyiceberg reads strings, binaries
    and lists as large types and puts metadata on struct fields); values and comparisons are the
    same either way.
    """
    return pa.field(field.name, _plain_type(field.type), field.nullable)


def _plain_type(arrow_type: pa.DataType) -> pa.DataType:
    t = pa.types
    if t.is_large_string(arrow_type) or t.is_string_view(arrow_type):
        return pa.string()
    if t.is_large_binary(arrow_type) or t.is_binary_view(arrow_type):
        return pa.binary()
    if t.is_dictionary(arrow_type):
        return _plain_type(arrow_type.value_type)
    if (
        t.is_list(arrow_type)
        or t.is_large_list(arrow_type)
        or t.is_list_view(arrow_type)
        or t.is_large_list_view(arrow_type)
    ):
        return pa.list_(_plain_field(arrow_type.value_field))
    if t.is_map(arrow_type):
        return pa.map_(
            _plain_field(arrow_type.key_field),
            _plain_field(arrow_type.item_field),
            keys_sorted=arrow_type.keys_sorted,
        )
    if t.is_struct(arrow_type):
        return pa.struct([_plain_field(field) for field in arrow_type])
    return arrow_type


def _serializable(schema: pa.Schema) -> bool:
    try:
        pc.scalar(True).to_substrait(schema)
    except pa.ArrowException:
        return False
    return True


def _substrait_schema(schema: pa.Schema) -> pa.Schema:
    """The schema the expression is serialized against: plain types, no columns Substrait lacks.

    A column Substrait cannot represent (uuid, duration, ...) is left out: an expression that reads
    it then fails to serialize and converts to ``AlwaysTrue``, instead of binding to another type.
    """
    plain = pa.schema([_plain_field(field) for field in schema])
    if _serializable(plain):
        return plain
    return pa.schema([f for f in plain if _serializable(pa.schema([f]))])


def _compare(op: str, column: str, value: Literal[Any]) -> BooleanExpression:
    # Keyword arguments: mypy sees pyiceberg's predicates through their pydantic fields.
    term = Reference(column)
    if op == "equal":
        return EqualTo(term=term, value=value)
    if op == "not_equal":
        return NotEqualTo(term=term, value=value)
    if op == "lt":
        return LessThan(term=term, value=value)
    if op == "lte":
        return LessThanOrEqual(term=term, value=value)
    if op == "gt":
        return GreaterThan(term=term, value=value)
    return GreaterThanOrEqual(term=term, value=value)


class _SubstraitToIceberg:
    """Convert one Substrait expression (as pyarrow writes it) to a pyiceberg expression.

    ``convert(e, negate=False)`` returns an expression true on every row where ``e`` is true;
    ``convert(e, negate=True)`` one true on every row where ``e`` is false (not null). Either is
    exact when it is true on no other row.
    """

    def __init__(self, functions: dict[int, str], schema: pa.Schema) -> None:
        self._functions = functions
        self._schema = schema

    def convert(self, expr: algebra_pb2.Expression, negate: bool) -> _Result:
        try:
            return self._convert(expr, negate)
        except UnconvertibleError:
            return AlwaysTrue(), False

    def _convert(self, expr: algebra_pb2.Expression, negate: bool) -> _Result:
        kind = expr.WhichOneof("rex_type")
        if kind == "scalar_function":
            return self._function(expr.scalar_function, negate)
        if kind == "singular_or_list":
            return self._is_in(expr.singular_or_list, negate)
        if kind == "selection":
            name, arrow_type = self._field(expr)
            if not pa.types.is_boolean(arrow_type):
                raise UnconvertibleError
            return EqualTo(term=Reference(name), value=BooleanLiteral(not negate)), True
        if kind == "literal":
            literal_kind = expr.literal.WhichOneof("literal_type")
            if literal_kind == "null":
                return AlwaysFalse(), True
            if literal_kind == "boolean":
                return (AlwaysTrue() if expr.literal.boolean != negate else AlwaysFalse()), True
        raise UnconvertibleError

    # --- functions ---

    def _function(self, function: algebra_pb2.Expression.ScalarFunction, negate: bool) -> _Result:
        name = self._functions.get(function.function_reference, "")
        args: list[algebra_pb2.Expression] = []
        for argument in function.arguments:
            if argument.WhichOneof("arg_type") != "value":
                raise UnconvertibleError
            args.append(argument.value)
        options = {option.name: tuple(option.preference) for option in function.options}
        if name in _STARTS_WITH:
            if options != {"case_sensitivity": ("CASE_SENSITIVE",)}:
                raise UnconvertibleError
            return self._starts_with(args, negate)
        if options:
            raise UnconvertibleError
        if name in _AND or name in _OR:
            return self._connective(name in _AND, args, negate)
        if name in _NOT and len(args) == 1:
            return self._convert(args[0], not negate)
        if name in _COMPARISONS and len(args) == 2:
            return self._comparison(_COMPARISONS[name], args, negate)
        if len(args) == 1:
            column, arrow_type = self._field(args[0])
            if name in _IS_NAN and pa.types.is_floating(arrow_type):
                return (
                    NotNaN(term=Reference(column)) if negate else IsNaN(term=Reference(column))
                ), True
            if (name in _IS_NULL or name in _IS_NOT_NULL) and not pa.types.is_nested(arrow_type):
                return (
                    NotNull(term=Reference(column))
                    if (name in _IS_NULL) == negate
                    else IsNull(term=Reference(column))
                ), True
        raise UnconvertibleError

    def _connective(
        self, conjunction: bool, args: Sequence[algebra_pb2.Expression], negate: bool
    ) -> _Result:
        if len(args) < 2:
            raise UnconvertibleError
        parts = [self.convert(arg, negate) for arg in args]
        # not (a and b) = (not a) or (not b): De Morgan holds in three-valued logic.
        if conjunction != negate:
            combined: BooleanExpression = And(*(expr for expr, _ in parts))
            decisive: BooleanExpression = AlwaysFalse()
        else:
            combined = Or(*(expr for expr, _ in parts))
            decisive = AlwaysTrue()
        exact = all(part_exact for _, part_exact in parts) or (decisive, True) in parts
        return combined, exact

    def _comparison(self, op: str, args: Sequence[algebra_pb2.Expression], negate: bool) -> _Result:
        left, right = args
        if left.WhichOneof("rex_type") == "literal":
            op, left, right = _FLIPPED[op], right, left
        if right.WhichOneof("rex_type") != "literal":
            raise UnconvertibleError  # field against field, or computed values
        column, arrow_type = self._field(left)
        value = iceberg_literal(right.literal, arrow_type)
        if value is Special.NULL:  # comparing with null is null
            return AlwaysFalse(), True
        if value is Special.NAN:  # every comparison with NaN is false, except !=
            true_on_values = (op == "not_equal") != negate
            return (NotNull(term=Reference(column)) if true_on_values else AlwaysFalse()), True
        if not negate:
            return _compare(op, column, value), True
        negated = _compare(_NEGATED[op], column, value)
        if pa.types.is_floating(arrow_type) and op not in ("equal", "not_equal"):
            return Or(negated, IsNaN(term=Reference(column))), True
        return negated, True

    def _starts_with(self, args: Sequence[algebra_pb2.Expression], negate: bool) -> _Result:
        if len(args) != 2 or args[1].WhichOneof("rex_type") != "literal":
            raise UnconvertibleError
        column, arrow_type = self._field(args[0])
        if not pa.types.is_string(arrow_type):
            raise UnconvertibleError
        prefix = iceberg_literal(args[1].literal, arrow_type)
        if not isinstance(prefix, Literal):
            return AlwaysFalse(), True
        return (
            NotStartsWith(term=Reference(column), value=prefix)
            if negate
            else StartsWith(term=Reference(column), value=prefix)
        ), True

    def _is_in(self, is_in: algebra_pb2.Expression.SingularOrList, negate: bool) -> _Result:
        column, arrow_type = self._field(is_in.value)
        term = Reference(column)
        values: set[Literal[Any]] = set()
        zero: Literal[Any] | None = None
        zero_signs: set[float] = set()
        has_null = has_nan = False
        for option in is_in.options:
            if option.WhichOneof("rex_type") != "literal":
                raise UnconvertibleError
            value = iceberg_literal(option.literal, arrow_type)
            if value is Special.NULL:
                has_null = True
            elif value is Special.NAN:
                has_nan = True
            elif isinstance(value, (FloatLiteral, DoubleLiteral)) and value.value == 0:
                zero = value
                zero_signs.add(math.copysign(1.0, value.value))
            else:
                values.add(value)
        # pyarrow's is_in compares floats bit for bit: 0.0 is not in [-0.0], and NaN matches only
        # a NaN with the same bits. Iceberg compares numerically (0.0 == -0.0, IsNaN for all NaNs),
        # so a zero matches both zeros and NaN all NaNs: exact only with both zeros and no NaN.
        # A null row is never in a set without null; with null in the set, pyarrow's is_in matches
        # null rows or not (skip_nulls), and Substrait does not say which: not exact either.
        exact = not has_null and not has_nan and len(zero_signs) != 1
        if not negate:
            parts: list[BooleanExpression] = [In(term=term, values=values)]
            if zero is not None:
                parts.append(EqualTo(term=term, value=zero))
            if has_nan:
                parts.append(IsNaN(term=term))
            if has_null:
                parts.append(IsNull(term=term))
            return (Or(*parts) if len(parts) > 1 else parts[0]), exact
        not_in: BooleanExpression = NotIn(term=term, values=values)
        if zero is not None and len(zero_signs) == 2:
            not_in = And(not_in, NotEqualTo(term=term, value=zero))
        # is_in is false, not null, on a null row: ``not is_in`` keeps null rows.
        return Or(not_in, IsNull(term=term)), exact

    # --- operands ---

    def _field(self, expr: algebra_pb2.Expression) -> tuple[str, pa.DataType]:
        """The Iceberg name (dotted for struct fields) and Arrow type of a field reference."""
        if expr.WhichOneof("rex_type") != "selection":
            raise UnconvertibleError
        selection = expr.selection
        if (
            selection.WhichOneof("reference_type") != "direct_reference"
            or selection.WhichOneof("root_type") != "root_reference"
        ):
            raise UnconvertibleError
        reference = selection.direct_reference
        fields: pa.Schema | pa.StructType = self._schema
        names: list[str] = []
        while True:
            if reference.WhichOneof("reference_type") != "struct_field":
                raise UnconvertibleError  # list elements, map keys
            index = reference.struct_field.field
            if not 0 <= index < len(fields):
                raise UnconvertibleError
            field = fields.field(index)
            names.append(field.name)
            if not reference.struct_field.HasField("child"):
                break
            if not pa.types.is_struct(field.type):
                raise UnconvertibleError
            fields, reference = field.type, reference.struct_field.child
        if len(names) > 1 and any("." in name for name in names):
            raise UnconvertibleError  # the dotted Iceberg name would be ambiguous
        return ".".join(names), field.type


def arrow_to_iceberg(expression: pc.Expression, schema: pa.Schema) -> IcebergFilter:
    """Convert a pyarrow expression to a pyiceberg expression for partition and file pruning.

    The conversion walks the expression's Substrait form. It converts comparisons of a column with
    a literal (``==``, ``!=``, ``<``, ``<=``, ``>``, ``>=``, either side), ``isin``, ``is_null``,
    ``is_valid``, ``is_nan``, ``starts_with`` (case-sensitive), boolean columns, ``&``, ``|``
    and ``~``, over top-level and struct columns, with integer, float, string, binary, boolean,
    date32, timestamp[us] (no time zone), time64[us] and decimal literals. Anything else
    (arithmetic, casts, column against column, other functions) becomes ``AlwaysTrue``, as does the
    whole expression when pyarrow cannot serialize it to Substrait (time-zone-aware or
    non-microsecond timestamp literals, comparisons that need an implicit cast such as an int
    column with a float, ``is_null(nan_is_null=True)``).

    Args:
        expression: the filter.
        schema: the Arrow schema the filter applies to, with the Iceberg column names.

    Returns:
        The Iceberg expression (unbound, true on every row where ``expression`` is true) and
        whether it is exact.

    Raises:
        FilterTypeError: ``expression`` is not a ``pyarrow.compute.Expression``.
    """
    if not isinstance(expression, pc.Expression):
        raise FilterTypeError(
            f"expression must be a pyarrow.compute.Expression, got {type(expression).__name__}"
        )
    substrait_schema = _substrait_schema(schema)
    try:
        serialized = expression.to_substrait(substrait_schema, allow_arrow_extensions=True)
    except pa.ArrowException:
        return IcebergFilter(AlwaysTrue(), False)
    message = extended_expression_pb2.ExtendedExpression()
    message.ParseFromString(bytes(serialized))  # type: ignore[no-untyped-call, unused-ignore]
    if len(message.referred_expr) != 1:
        return IcebergFilter(AlwaysTrue(), False)
    functions = {
        declaration.extension_function.function_anchor: (
            # A compound name ("equal:any_any") carries the signature after the colon.
            declaration.extension_function.name.split(":", 1)[0]
        )
        for declaration in message.extensions
        if declaration.WhichOneof("mapping_type") == "extension_function"
    }
    converter = _SubstraitToIceberg(functions, substrait_schema)
    return IcebergFilter(*converter.convert(message.referred_expr[0].expression, negate=False))
