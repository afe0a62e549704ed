"""What reading WebDataset shards needs from planning, carried by the plan's
`WebDatasetReadOptions` (the format itself keeps none: `Format`)."""

from __future__ import annotations

from dataclasses import dataclass

from ..formats.base import ReadOptions

__all__ = ["WebDatasetReadOptions"]


@dataclass(frozen=True)
class WebDatasetReadOptions(ReadOptions):
    """`ReadOptions` of a planned WebDataset read.

    Attributes:
        all_columns: the columns read when ``columns`` is ``None``: ``__key__``, ``__url__``
            and every extension of every shard, in order of first appearance (a worker that
            reads one shard would see only its extensions).
        skipping: the components (each a column's alternatives) whose absence leaves a sample
            out under ``missing_component="skip"``: a chunk's rows are the plan's, whatever
            columns a read asks for (counting a filter reads fewer).
    """

    all_columns: tuple[str, ...] | None = None
    skipping: tuple[tuple[str, ...], ...] | None = None
