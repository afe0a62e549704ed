"""Substrait literals (as pyarrow writes them) as pyiceberg literals, for `from_arrow`."""

from __future__ import annotations

import math
from decimal import Decimal
from enum import Enum
from typing import Any

import pyarrow as pa
from google.protobuf.unknown_fields import (  # type: ignore[import-untyped, unused-ignore]
    UnknownFieldSet,
)
from pyiceberg.expressions.literals import (
    BinaryLiteral,
    BooleanLiteral,
    DateLiteral,
    DecimalLiteral,
    DoubleLiteral,
    FloatLiteral,
    Literal,
    LongLiteral,
    StringLiteral,
    TimeLiteral,
    TimestampLiteral,
)
from substrait import algebra_pb2  # type: ignore[import-untyped, unused-ignore]

__all__ = ["Special", "UnconvertibleError", "iceberg_literal"]

# Literal fields Substrait has deprecated and newer protobuf classes no longer know; pyarrow 26
# still writes them (microseconds since the epoch, or since midnight). They survive parsing as
# unknown fields.
_DEPRECATED_TIMESTAMP = 14
_DEPRECATED_TIME = 17
_DEPRECATED_TIMESTAMP_TZ = 27
_VARINT = 0


class UnconvertibleError(Exception):
    """A part of the expression has no Iceberg equivalent."""


class Special(Enum):
    """Literal values pyiceberg has no literal for."""

    NULL = "null"
    NAN = "nan"


def _deprecated_literal(literal: algebra_pb2.Expression.Literal, number: int) -> int | None:
    """The int64 value of the deprecated literal field ``number``, if ``literal`` holds it."""
    for field in UnknownFieldSet(literal):
        if field.field_number == number and field.wire_type == _VARINT:
            value = int(field.data)
            return value - (1 << 64) if value >= 1 << 63 else value
    return None


def _to_micros(value: int, precision: int) -> int:
    """A value in units of 10**-precision seconds, in microseconds (exactly, or not at all)."""
    if precision <= 6:
        factor: int = 10 ** (6 - precision)
        return value * factor
    scale: int = 10 ** (precision - 6)
    if value % scale:
        raise UnconvertibleError
    return value // scale


def _unscaled_decimal(unscaled: int, scale: int) -> Decimal:
    digits = tuple(int(digit) for digit in str(abs(unscaled)))
    return Decimal((1 if unscaled < 0 else 0, digits, -scale))


def iceberg_literal(
    literal: algebra_pb2.Expression.Literal, arrow_type: pa.DataType
) -> Literal[Any] | Special:
    """The pyiceberg literal for a Substrait literal compared with a column of ``arrow_type``.

    Returns ``Special`` for null and NaN (pyiceberg has no literal for either). Raises
    ``UnconvertibleError`` for a literal whose kind does not match the column's type (pyiceberg
    could not bind it) or that Iceberg cannot represent.
    """
    t = pa.types
    kind = literal.WhichOneof("literal_type")
    if kind == "null":
        return Special.NULL
    if t.is_integer(arrow_type):
        if kind == "i8":
            return LongLiteral(literal.i8)
        if kind == "i16":
            return LongLiteral(literal.i16)
        if kind == "i32":
            return LongLiteral(literal.i32)
        if kind == "i64":
            return LongLiteral(literal.i64)
    elif t.is_float32(arrow_type) or t.is_float64(arrow_type):
        if kind == "fp32":
            return Special.NAN if math.isnan(literal.fp32) else FloatLiteral(literal.fp32)
        if kind == "fp64":
            return Special.NAN if math.isnan(literal.fp64) else DoubleLiteral(literal.fp64)
    elif t.is_boolean(arrow_type):
        if kind == "boolean":
            return BooleanLiteral(literal.boolean)
    elif t.is_string(arrow_type):
        if kind == "string":
            return StringLiteral(literal.string)
    elif t.is_binary(arrow_type) or t.is_fixed_size_binary(arrow_type):
        if kind == "binary":
            return BinaryLiteral(literal.binary)
        if kind == "fixed_binary":
            return BinaryLiteral(literal.fixed_binary)
    elif t.is_date32(arrow_type):
        if kind == "date":
            return DateLiteral(literal.date)
    elif t.is_timestamp(arrow_type) and arrow_type.unit == "us":
        return TimestampLiteral(_timestamp(literal, kind, arrow_type.tz is not None))
    elif t.is_time64(arrow_type) and arrow_type.unit == "us":
        if kind == "precision_time":
            return TimeLiteral(
                _to_micros(literal.precision_time.value, literal.precision_time.precision)
            )
        micros = _deprecated_literal(literal, _DEPRECATED_TIME) if kind is None else None
        if micros is not None:
            return TimeLiteral(micros)
    elif (
        t.is_decimal(arrow_type) and kind == "decimal" and literal.decimal.scale == arrow_type.scale
    ):
        unscaled = int.from_bytes(literal.decimal.value, "little", signed=True)
        return DecimalLiteral(_unscaled_decimal(unscaled, literal.decimal.scale))
    raise UnconvertibleError


def _timestamp(literal: algebra_pb2.Expression.Literal, kind: str | None, tz: bool) -> int:
    if kind == "precision_timestamp_tz" and tz:
        value = literal.precision_timestamp_tz
        return _to_micros(value.value, value.precision)
    if kind == "precision_timestamp" and not tz:
        value = literal.precision_timestamp
        return _to_micros(value.value, value.precision)
    if kind is None:
        number = _DEPRECATED_TIMESTAMP_TZ if tz else _DEPRECATED_TIMESTAMP
        micros = _deprecated_literal(literal, number)
        if micros is not None:
            return micros
    raise UnconvertibleError
