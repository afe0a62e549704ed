"""What reading CSV and JSON Lines needs from planning: each file's `TextLayout`, carried by
the plan's `TextReadOptions` (the format itself keeps none: `Format`)."""

from __future__ import annotations

from dataclasses import dataclass, field

import pyarrow as pa

from ..base import ReadOptions

__all__ = ["TextLayout", "TextReadOptions"]


@dataclass(frozen=True)
class TextLayout:
    """What reading a file needs from planning.

    Attributes:
        names: the file's column names in file order (CSV: the header's, or given).
        schema: the columns read and the types every chunk is parsed with.
        inferred: whether ``schema`` was inferred (not given), which error advice depends on.
        empty_is_null: string columns whose ``null_values`` are nulls (CSV columns whose
            every value in the inference sample is null, which pyarrow would type as null).
        null_values: the strings pyarrow reads as null in a column it infers as non-string
            (its ``ConvertOptions.null_values``, or the format's ``null_values=``).
        source_names: the file's own names when ``names`` renamed them (`names` module: a
            repeated or empty name); empty when they are the file's.
    """

    names: tuple[str, ...]
    schema: pa.Schema
    inferred: bool
    empty_is_null: tuple[str, ...] = ()
    null_values: tuple[str, ...] = ("",)
    source_names: tuple[str, ...] = ()


@dataclass(frozen=True)
class TextReadOptions(ReadOptions):
    """`ReadOptions` of a planned CSV or JSON Lines read.

    Attributes:
        layouts: each planned file's layout, by path: the names and types planning fixed,
            which every chunk of the file is parsed with (files share one layout object, so
            a pickle holds it once).
    """

    layouts: dict[str, TextLayout] = field(default_factory=dict, repr=False)

    def layout(self, path: str) -> TextLayout | None:
        """The layout planning fixed for ``path``, or ``None`` (not a planned file)."""
        return self.layouts.get(path)
