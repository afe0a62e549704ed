"""What workers need to read a Lance plan's chunks: the dataset, its pinned version, and each
fragment's units of live rows."""

from __future__ import annotations

from dataclasses import dataclass

from ..sources.tables import TableReadOptions

__all__ = ["FragmentInfo", "LanceReadOptions"]


@dataclass(frozen=True)
class FragmentInfo:
    """One fragment of the plan, as its chunks are read.

    Attributes:
        path: the fragment's first data file, without protocol (the chunks' ``path``).
        fragment_id: its id in the dataset.
        units: its live rows cut into units (the chunks' row groups), in order.
    """

    path: str
    fragment_id: int
    units: tuple[int, ...]

    def first_row(self, unit: int) -> int:
        """The fragment's live-row ordinal of the first row of ``unit``."""
        return sum(self.units[:unit])


@dataclass(frozen=True)
class LanceReadOptions(TableReadOptions[FragmentInfo]):
    """`ReadOptions` of a Lance read: ``columns`` are the dataset's column names.

    Attributes:
        table: the dataset as the user named it, for messages.
        uri: where pylance opens it (an absolute path, or a URL).
        version: the pinned version (a number): every worker opens this one.
        files: the plan's fragments (by their first data file).
    """

    uri: str = ""
    version: int = 0
