"""How rows become batches of tokens: `Packing` (a token-list column packed into sequences)
and `TokenBudget` (batches of whole rows under a token budget), each optionally with
`Balance` (every step's batches of similar cost on every rank); docs/concepts/packing.md,
docs/adr/0022-packed-sequences.md and docs/adr/0032-balance-by-compute.md."""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

from .errors import InvalidArgumentError
from .errors.keywords import SuggestsKeywords, check_positive

__all__ = [
    "BALANCE_COSTS",
    "PACKED_KEYS",
    "PACKING_METHODS",
    "PACKING_POSITIONS",
    "Balance",
    "Packing",
    "TokenBudget",
]

BALANCE_COSTS = ("attention", "tokens")


@dataclass(frozen=True)
class Balance(SuggestsKeywords):
    """Give every rank, at every step, a batch of about the same compute: within each window
    of ``window`` steps the batches the plan made for all ranks are handed out again, grouped
    by cost, in a seeded step order (docs/adr/0032-balance-by-compute.md). Every batch is
    still delivered exactly once, to one rank; every rank works the same answer out from the
    plan, without a collective.

    Args:
        window: steps whose batches are regrouped together (a DataLoader worker's share:
            ``ceil(window / num_workers)`` of its batches). Longer windows balance better and
            keep more batches waiting in memory.
        cost: what a batch costs, over its document fragments' lengths ``L`` (a token budget's
            batch: each row as long as its longest): ``"attention"``: ``sum L**2 + linear *
            sum L``; ``"tokens"``: ``sum L``; or a callable taking one batch's lengths (an int64
            numpy array) and returning a number.
        linear: ``"attention"``'s weight of one token against one unit of ``L**2``: a model's
            dense FLOPs a token over its attention FLOPs a token pair
            (`torch_dataloader_utils.planning.linear_coefficient`: about 51,000 for a 7B
            Llama shape); 0: attention alone.

    Raises:
        InvalidArgumentError: an option is out of range.
        UnknownKeywordError: a keyword it does not take; the message names the closest one.
    """

    window: int = 64
    cost: str | Callable[[Any], float] = "attention"
    linear: float = 0.0

    def __post_init__(self) -> None:
        check_positive(window=self.window)
        if not callable(self.cost) and self.cost not in BALANCE_COSTS:
            raise InvalidArgumentError(
                f"Balance's cost must be one of {BALANCE_COSTS} or a callable, got {self.cost!r}"
            )
        linear: object = self.linear
        if isinstance(linear, bool) or not isinstance(linear, numbers.Real):
            raise InvalidArgumentError(f"Balance's linear must be a number, got {linear!r}")
        if not math.isfinite(float(linear)) or float(linear) < 0:
            raise InvalidArgumentError(f"Balance's linear must be finite and >= 0, got {linear!r}")
        object.__setattr__(self, "linear", float(linear))

    def identity(self) -> dict[str, Any]:
        """What of it decides which rank reads which batch (it enters the plan's fingerprint,
        so that a state saved under another balance is refused); a callable by its name."""
        cost = self.cost if isinstance(self.cost, str) else _name(self.cost)
        return {"window": self.window, "cost": cost, "linear": self.linear}


def _name(function: Callable[..., Any]) -> str:
    module = getattr(function, "__module__", "")
    return f"{module}.{getattr(function, '__qualname__', type(function).__name__)}"


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
        balance: a `Balance`: every step's packed batches of similar cost on every rank
            (``None``, default: each rank reads its batches in plan order).

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
    balance: Balance | None = None

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
        _check_balance(self.balance, "Packing")

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
        balance: a `Balance`: every step's batches of similar cost on every rank, a batch's
            rows counted as long as its longest (its padded shape).

    Raises:
        InvalidArgumentError: an option is out of range.
        UnknownKeywordError: a keyword it does not take; the message names the closest one.
    """

    column: str
    max_tokens: int
    overflow: str = "error"
    balance: Balance | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.column, str) or not self.column:
            raise InvalidArgumentError(f"TokenBudget's column must be a name, got {self.column!r}")
        check_positive(max_tokens=self.max_tokens)
        if self.overflow not in ("error", "truncate"):
            raise InvalidArgumentError(
                f'TokenBudget\'s overflow must be "error" or "truncate", got {self.overflow!r}'
            )
        _check_balance(self.balance, "TokenBudget")


def _check_balance(balance: object, owner: str) -> None:
    if balance is not None and not isinstance(balance, Balance):
        raise InvalidArgumentError(
            f"{owner}'s balance must be a tdu.Balance (or None), got {balance!r}"
        )
