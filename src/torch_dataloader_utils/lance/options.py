"""What workers need to read a Lance plan's chunks: the dataset, its pinned version, and each
fragment's units of live rows."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import Any

from ..errors import InvalidArgumentError
from ..formats import ReadOptions

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
class LanceReadOptions(ReadOptions):
    """`ReadOptions` of a Lance read: ``columns`` are the dataset's column names.

    Attributes:
        table: the dataset as the user named it, for messages.
        uri: where pylance opens it (an absolute path, or a URL).
        version: the pinned version (a number): every worker opens this one.
        fragments: the plan's fragments.
    """

    table: str = ""
    uri: str = ""
    version: int = 0
    fragments: tuple[FragmentInfo, ...] = ()

    @cached_property
    def _by_path(self) -> dict[str, FragmentInfo]:
        return {f.path: f for f in self.fragments}

    def fragment(self, path: str) -> FragmentInfo:
        """The fragment of a chunk.

        Raises:
            InvalidArgumentError: the path is not a fragment of this plan.
        """
        try:
            return self._by_path[path]
        except KeyError:
            raise InvalidArgumentError(
                f"{path} is not a fragment of the plan of Lance dataset {self.table} at "
                f"version {self.version}"
            ) from None

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state.pop("_by_path", None)  # rebuilt on first use
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
