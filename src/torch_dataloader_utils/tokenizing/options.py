"""`Tokenize` and `Transform`: what a source computes from its rows in the loader, each with the
fingerprint that keys the census and the state (a tokenizer's or a function's code cannot be
hashed reliably: a plain callable names its own)."""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa

from ..errors import InvalidArgumentError
from ..errors.keywords import SuggestsKeywords
from .encoders import own_parallelism

__all__ = ["Tokenize", "Transform", "tokenizer_digest"]


def tokenizer_digest(tokenizer: Any, given: str | None) -> str:
    """What identifies ``tokenizer``'s output: ``given``, else the serialized form of a
    `tokenizers.Tokenizer` (or of a transformers tokenizer's backend), vocabulary and rules.

    Raises:
        InvalidArgumentError: it is a plain callable (or a tokenizer without a serialized form)
            and ``given`` is ``None``.
    """
    if given is not None:
        return hashlib.sha256(f"given\0{given}".encode()).hexdigest()[:16]
    backend = getattr(tokenizer, "backend_tokenizer", None)  # (a transformers tokenizer)
    serialized = getattr(backend if backend is not None else tokenizer, "to_str", None)
    if callable(serialized):
        kind = type(tokenizer).__name__
        text = serialized()
        return hashlib.sha256(f"{kind}\0{text}".encode()).hexdigest()[:16]
    raise InvalidArgumentError(
        f"Tokenize: the tokenizer {type(tokenizer).__name__} has no serialized form to identify "
        'it by: pass fingerprint="..." (a name that changes whenever its output would: the '
        "census and saved states are keyed by it)"
    )


@dataclass(frozen=True)
class Tokenize(SuggestsKeywords):
    """Tokenize a text column in the loader (docs/concepts/census.md).

    Args:
        column: the text column (strings).
        tokenizer: a `tokenizers.Tokenizer`, a transformers tokenizer, or any callable
            ``list[str] -> list[list[int]]`` (then with ``fingerprint``).
        output: the name of the column of token ids it adds (lists of int32), which `Packing`
            or `TokenBudget` then takes.
        eos_token: a token id appended to every text's tokens (``None``: none).
        add_special_tokens: whether the tokenizer adds its special tokens (BOS, ...).
        fingerprint: what identifies the tokenizer's output (required for a plain callable;
            by default a tokenizer's serialized vocabulary and rules).

    Raises:
        InvalidArgumentError: an option is of the wrong kind, or a callable has no fingerprint.
    """

    column: str
    tokenizer: Any = field(repr=False)
    output: str = "tokens"
    eos_token: int | None = None
    add_special_tokens: bool = False
    fingerprint: str | None = None
    digest: str = field(init=False, compare=False)

    def __post_init__(self) -> None:
        for name in ("column", "output"):
            value = getattr(self, name)
            if not isinstance(value, str) or not value:
                raise InvalidArgumentError(f"Tokenize's {name} must be a name, got {value!r}")
        if self.output == self.column:
            raise InvalidArgumentError(
                f"Tokenize's output {self.output!r} would replace its text column: name another"
            )
        if self.eos_token is not None and (
            isinstance(self.eos_token, bool)
            or not isinstance(self.eos_token, int)
            or not 0 <= self.eos_token < 2**31
        ):
            raise InvalidArgumentError(
                f"Tokenize's eos_token must be a token id (an int >= 0), got {self.eos_token!r}"
            )
        if not isinstance(self.add_special_tokens, bool):
            raise InvalidArgumentError("Tokenize's add_special_tokens must be True or False")
        if not callable(self.tokenizer) and not hasattr(self.tokenizer, "encode_batch"):
            raise InvalidArgumentError(
                f"Tokenize's tokenizer must be a tokenizers.Tokenizer, a transformers "
                f"tokenizer or a callable, got {type(self.tokenizer).__name__}"
            )
        if self.fingerprint is not None and (
            not isinstance(self.fingerprint, str) or not self.fingerprint
        ):
            raise InvalidArgumentError("Tokenize's fingerprint must be a non-empty string")
        own_parallelism()  # (when made: before the DataLoader forks its workers)
        inner = tokenizer_digest(self.tokenizer, self.fingerprint)
        what = f"{inner}\0{self.eos_token}\0{self.add_special_tokens}"
        object.__setattr__(self, "digest", hashlib.sha256(what.encode()).hexdigest()[:16])


@dataclass(frozen=True)
class Transform(SuggestsKeywords):
    """A function over an Arrow record batch, run on a chunk's rows before tokenizing (a chat
    template, a quality filter that drops rows), with a fingerprint.

    It must give each row's output from that row alone (it may drop rows, add or replace
    columns), the same every time: a chunk's rows are counted once at planning, and a read
    that yields another count is an error.

    Args:
        function: ``pyarrow.RecordBatch -> pyarrow.RecordBatch`` (a `pyarrow.Table` is taken
            too).
        fingerprint: what identifies the function's output; change it whenever the function
            changes (the census and saved states are keyed by it).

    Raises:
        InvalidArgumentError: ``function`` is not callable or ``fingerprint`` is not a name.
    """

    function: Callable[[pa.RecordBatch], pa.RecordBatch | pa.Table] = field(repr=False)
    fingerprint: str

    def __post_init__(self) -> None:
        if not callable(self.function):
            raise InvalidArgumentError(
                f"Transform's function must be callable, got {type(self.function).__name__}"
            )
        if not isinstance(self.fingerprint, str) or not self.fingerprint:
            raise InvalidArgumentError(
                "Transform's fingerprint must be a non-empty string: what identifies its output"
            )

    @property
    def digest(self) -> str:
        """The fingerprint, as the census and states key it."""
        return hashlib.sha256(f"transform\0{self.fingerprint}".encode()).hexdigest()[:16]
