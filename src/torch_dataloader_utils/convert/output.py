"""What a dataset's batches are converted to (`Output`), checked when given."""

from __future__ import annotations

from dataclasses import dataclass

import pyarrow as pa

from .rules import Converter, ListFormat, NullPolicy, OutputFormat, check_output

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
        check_output(self.format, self.list_format, self.null_policy)

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
