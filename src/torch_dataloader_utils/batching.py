"""How rows become batches of tokens: `Packing` (a token-list column packed into sequences)
and `TokenBudget` (batches of whole rows under a token budget); docs/concepts/packing.md and
docs/adr/0022-packed-sequences.md."""

from __future__ import annotations

import math
import numbers
from collections.abc import Sequence
from dataclasses import dataclass
from fractions import Fraction

from .errors import InvalidArgumentError
from .errors.keywords import SuggestsKeywords, check_positive

__all__ = ["PACKED_KEYS", "PACKING_METHODS", "PACKING_POSITIONS", "Packing", "TokenBudget"]


@dataclass(frozen=True)
class Packing(SuggestsKeywords):
    """Pack a token-list column into sequences of ``seq_len`` tokens (docs/adr/0022).

    Args:
        column: the list-of-integers column holding each document's tokens.
        seq_len: tokens per sequence.
        pad_value: the token that pads a stream's last sequence.
        method: ``"concat"`` (documents concatenated and cut at ``seq_len``) or ``"best_fit"``
            (each batch's documents placed whole into its sequences where they fit; longer
            ones split).
        eos_token: a token appended after every document (``None``: none).
        fill: best fit: the share of a batch's ``batch_size * seq_len`` slots its tokens take
            (``0 < fill <= 1``); the rest is the room that keeps documents whole.
        positions: ``"fragment"`` (default: ``position_ids`` count from 0 in every fragment, a
            document's tokens within one sequence, and in each sequence's padding, so every
            attention implementation finds the boundaries from them alone) or ``"document"``
            (a token's position in its whole document, continued across sequences: the
            boundaries are then only in ``cu_seqlens`` and ``document_ids``; docs/adr/0026).
        static_shape: every batch ``[batch_size, seq_len]``, a stream's short last one padded
            with whole sequences of padding (``torch.compile`` and CUDA graphs never see
            another shape); ``False`` (default): the last batch has the sequences it fills.

    Raises:
        InvalidArgumentError: an option is out of range.
        UnknownKeywordError: a keyword it does not take; the message names the closest one.
    """

    column: str
    seq_len: int
    pad_value: int = 0
    method: str = "concat"
    eos_token: int | None = None
    fill: float = 0.95
    positions: str = "fragment"
    static_shape: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.column, str) or not self.column:
            raise InvalidArgumentError(f"Packing's column must be a name, got {self.column!r}")
        check_positive(seq_len=self.seq_len)
        if self.method not in PACKING_METHODS:
            raise InvalidArgumentError(
                f"Packing's method must be one of {PACKING_METHODS}, got {self.method!r}"
            )
        for name in ("pad_value", "eos_token"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
                raise InvalidArgumentError(f"Packing's {name} must be an int, got {value!r}")
        if self.positions not in PACKING_POSITIONS:
            raise InvalidArgumentError(
                f"Packing's positions must be one of {PACKING_POSITIONS}, got {self.positions!r}"
            )
        if not isinstance(self.static_shape, bool):
            raise InvalidArgumentError(
                f"Packing's static_shape must be True or False, got {self.static_shape!r}"
            )
        fill: object = self.fill  # (checked: a caller's value may be of any type)
        if isinstance(fill, bool) or not isinstance(fill, numbers.Real):
            raise InvalidArgumentError(f"Packing's fill must be a number, got {fill!r}")
        if not 0 < float(fill) <= 1:  # (NaN too)
            raise InvalidArgumentError(f"Packing's fill must be in (0, 1], got {fill!r}")
        object.__setattr__(self, "fill", float(fill))  # (a numpy float enters the plan's JSON)

    @property
    def seq_tokens(self) -> int:
        """Tokens of the order a sequence takes: ``seq_len``, or for best fit
        ``floor(seq_len * fill)`` (a packed mixture gives each source this many at a time)."""
        if self.method == "concat":
            return self.seq_len
        return math.floor(Fraction(str(self.fill)) * self.seq_len)  # (0.29 * 100 is 28.99...)

    @property
    def unit(self) -> int:
        """The earlier name of `seq_tokens`."""
        return self.seq_tokens

    def batch_tokens(self, batch_size: int) -> int:
        """Tokens of the order a batch of ``batch_size`` sequences takes."""
        return batch_size * self.seq_tokens

    def check_columns(
        self, columns: Sequence[str] | None, *, source_column: str | None, label: str = ""
    ) -> None:
        """Refuse ``columns`` (a source's, named ``label`` in a mixture) that name another
        column than `column`: a packed batch holds only the sequences made of it, so any other
        would be dropped.

        Raises:
            InvalidArgumentError: another column is named.
        """
        if isinstance(columns, str) or not isinstance(columns, Sequence):
            return  # (None: the token column alone is read; other kinds are refused by Source)
        others = [c for c in columns if c != self.column]
        if not others:
            return
        keys = ", ".join(PACKED_KEYS)
        if source_column is not None:
            keys += f", and {source_column!r} (the mixture's source_column)"
        raise InvalidArgumentError(
            f"{f'the source {label!r}: ' if label else ''}"
            f"columns={list(columns)!r} with packing=: a packed batch cannot carry "
            f"{', '.join(map(repr, others))}; it yields only {keys}, made from the column "
            f"{self.column!r}. Pass columns=[{self.column!r}], or leave columns unset"
        )


PACKING_METHODS = ("concat", "best_fit")
# What a packed batch holds (besides a mixture's source_column).
PACKED_KEYS = ("input_ids", "position_ids", "document_ids", "cu_seqlens", "max_seqlen")
PACKING_POSITIONS = ("fragment", "document")


@dataclass(frozen=True)
class TokenBudget(SuggestsKeywords):
    """Batches of whole rows whose padded size (rows x longest row) is at most ``max_tokens``,
    instead of ``batch_size`` rows (docs/adr/0022).

    Args:
        column: the list column whose lengths count.
        max_tokens: the budget of a batch.
        overflow: a row longer than ``max_tokens``: ``"error"`` (default) or ``"truncate"``
            (cut to the budget; what was cut is counted).

    Raises:
        InvalidArgumentError: an option is out of range.
        UnknownKeywordError: a keyword it does not take; the message names the closest one.
    """

    column: str
    max_tokens: int
    overflow: str = "error"

    def __post_init__(self) -> None:
        if not isinstance(self.column, str) or not self.column:
            raise InvalidArgumentError(f"TokenBudget's column must be a name, got {self.column!r}")
        check_positive(max_tokens=self.max_tokens)
        if self.overflow not in ("error", "truncate"):
            raise InvalidArgumentError(
                f'TokenBudget\'s overflow must be "error" or "truncate", got {self.overflow!r}'
            )
