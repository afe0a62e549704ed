"""What a dataset's batches are converted to (`Output`), checked when given."""

from __future__ import annotations

from dataclasses import dataclass

import pyarrow as pa

from ..errors import InvalidArgumentError
from .rules import (
    LIST_FORMATS,
    NULL_POLICIES,
    OUTPUT_FORMATS,
    Converter,
    ListFormat,
    NullPolicy,
    OutputFormat,
)

__all__ = ["Output"]


@dataclass(frozen=True)
class Output:
    """How batches are converted (`Converter`'s options).

    Attributes:
        format: ``"torch"`` (default), ``"numpy"``, ``"arrow"`` or ``"dict"``.
        list_format: variable-length lists as ``"padded"`` (default), ``"offsets"``,
            ``"nested"``.
        null_policy: ``"error"`` (default), ``"fill"`` or ``"mask"``.
        pad_value: padding of ``list_format="padded"``.

    Raises:
        InvalidArgumentError: an option has an unknown value.
    """

    format: OutputFormat = "torch"
    list_format: ListFormat = "padded"
    null_policy: NullPolicy = "error"
    pad_value: int | float = 0

    def __post_init__(self) -> None:
        for name, value, allowed in (
            ("output_format", self.format, OUTPUT_FORMATS),
            ("list_format", self.list_format, LIST_FORMATS),
            ("null_policy", self.null_policy, NULL_POLICIES),
        ):
            if value not in allowed:
                raise InvalidArgumentError(f"{name} must be one of {allowed}, got {value!r}")
        if self.list_format == "nested" and self.format != "torch":
            raise InvalidArgumentError('list_format="nested" needs output_format="torch"')

    def converter(self, schema: pa.Schema) -> Converter:
        """The converter of batches of ``schema``.

        Raises:
            UnsupportedTypeError: a column has no mapping to the output format.
        """
        return Converter(
            schema,
            output_format=self.format,
            list_format=self.list_format,
            null_policy=self.null_policy,
            pad_value=self.pad_value,
        )
