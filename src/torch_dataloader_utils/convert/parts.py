"""Gathering an output batch from a shuffle block left in parts (`stream.blocks.BLOCK_PARTS`):
where each row lies (`Picks`) and the gather itself (`GatherParts`), done straight into its
destination like a `Gather`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

__all__ = ["GatherParts", "Picks"]


class Picks:
    """Where the rows of an output batch lie among a block's parts: for each part, the output
    positions it fills and its own rows that fill them (in output order)."""

    __slots__ = ("parts",)

    def __init__(self, starts: np.ndarray, rows: np.ndarray) -> None:
        """``starts``: the first block row of each part; ``rows``: the block rows to output."""
        part = np.searchsorted(starts, rows, side="right") - 1
        order = np.argsort(part, kind="stable")
        bounds = np.searchsorted(part[order], np.arange(len(starts) + 1)).tolist()
        self.parts: list[tuple[np.ndarray, np.ndarray]] = []
        for k, start in enumerate(starts.tolist()):
            positions = order[bounds[k] : bounds[k + 1]]
            self.parts.append((positions, rows[positions] - start))


@dataclass(frozen=True, slots=True)
class GatherParts:
    """Rows (first axis) of the arrays ``sources``, one per part of a block, at ``picks``."""

    sources: tuple[np.ndarray, ...]
    picks: Picks

    @property
    def dtype(self) -> np.dtype[Any]:
        return np.dtype(self.sources[0].dtype)

    def into(self, out: np.ndarray) -> None:
        """Gather into ``out`` (the output's shape)."""
        for source, (positions, rows) in zip(self.sources, self.picks.parts, strict=True):
            if len(positions) == len(out):  # every row from one part: straight in
                source.take(rows, axis=0, out=out)
            elif len(positions):
                out[positions] = source.take(rows, axis=0)
