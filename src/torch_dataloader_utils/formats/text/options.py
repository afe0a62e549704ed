"""What reading CSV and JSON Lines needs from planning: each file's `TextParsing`, carried by
the plan's `TextReadOptions` (the format itself keeps none: `Format`)."""

from __future__ import annotations

from dataclasses import dataclass, field

import pyarrow as pa

from ..base import ReadOptions

__all__ = ["TextParsing", "TextReadOptions"]


@dataclass(frozen=True)
class TextParsing:
    """What parsing a file needs from planning: its columns' names and types, and its nulls.

    Attributes:
        names: the file's column names in file order (CSV: the header's, or given).
        schema: the columns read and the types every chunk is parsed with.
        inferred: whether ``schema`` was inferred (not given), which error advice depends on.
        empty_is_null: string columns whose ``null_values`` are nulls (CSV columns whose
            every value in the inference sample is null, which pyarrow would type as null).
        null_values: the strings pyarrow reads as null in a column it infers as non-string
            (its ``ConvertOptions.null_values``, or the format's ``null_values=``).
        file_names: the file's own names when ``names`` renamed them (`names` module: a
            repeated or empty name); empty when they are the file's.
    """

    names: tuple[str, ...]
    schema: pa.Schema
    inferred: bool
    empty_is_null: tuple[str, ...] = ()
    null_values: tuple[str, ...] = ("",)
    file_names: tuple[str, ...] = ()


@dataclass(frozen=True)
class TextReadOptions(ReadOptions):
    """`ReadOptions` of a planned CSV or JSON Lines read.

    Attributes:
        specs: each planned file's `TextParsing`, by path: the names and types planning
            fixed, which every chunk of the file is parsed with (files share one such object,
            so a pickle holds it once).
    """

    specs: dict[str, TextParsing] = field(default_factory=dict, repr=False)

    def spec_of(self, path: str) -> TextParsing | None:
        """What planning fixed for parsing ``path``, or ``None`` (not a planned file)."""
        return self.specs.get(path)
