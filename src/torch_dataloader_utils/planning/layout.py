"""The layout: every option that decides which rows each stream reads and in what order."""

from __future__ import annotations

from dataclasses import dataclass

from .assign import Remainder, SplitStrategy

__all__ = ["Layout"]


@dataclass(frozen=True, slots=True)
class Layout:
    """The options that decide which rows each stream reads and in what order.

    Attributes:
        batch_size: rows per batch.
        shuffle: permute chunks per epoch and rows inside blocks.
        seed: the shuffle seed.
        drop_last: trim each rank's span to whole batches.
        remainder: rows that do not divide among ranks: ``"drop"``, ``"pad"``, ``"uneven"``.
        block_rows: rows shuffled together (a stream is read in blocks of this many rows).
        first_block_rows: rows of a stream's first block (blocks double up to ``block_rows``).
        strategy: how streams divide the epoch (`strategy_of`).
        unit: a packed dataset's tokens per sequence (0: not packed). Its rows are tokens,
            its blocks are shuffled by whole documents (`shuffle.document_permutation`), and a
            packed mixture gives each ``unit`` positions to one source.
    """

    batch_size: int
    shuffle: bool
    seed: int
    drop_last: bool
    remainder: Remainder
    block_rows: int
    first_block_rows: int
    strategy: SplitStrategy = "equal"
    unit: int = 0

    @property
    def documents(self) -> bool:
        """Rows are a packed dataset's tokens, shuffled by whole documents."""
        return self.unit > 0

    def batches(self, rows: int) -> int:
        """Batches a stream of ``rows`` rows yields."""
        if self.drop_last:
            return rows // self.batch_size
        return -(-rows // self.batch_size)
