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
        seq_tokens: a packed dataset's tokens of its order per sequence (0: not packed). Its
            rows are tokens, its blocks are shuffled by whole documents
            (`shuffle.document_permutation`), and a packed mixture gives each ``seq_tokens``
            positions to one source. A saved state names it ``"unit"`` (`state.codec`).
    """

    batch_size: int
    shuffle: bool
    seed: int
    drop_last: bool
    remainder: Remainder
    block_rows: int
    first_block_rows: int
    strategy: SplitStrategy = "equal"
    seq_tokens: int = 0

    @property
    def unit(self) -> int:
        """The earlier name of `seq_tokens`."""
        return self.seq_tokens

    @property
    def documents(self) -> bool:
        """Rows are a packed dataset's tokens, shuffled by whole documents."""
        return self.seq_tokens > 0

    def batches(self, rows: int) -> int:
        """Batches a stream of ``rows`` rows yields."""
        if self.drop_last:
            return rows // self.batch_size
        return -(-rows // self.batch_size)
