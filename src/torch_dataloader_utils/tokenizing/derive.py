"""`Derivation`: a source's `Transform` then its `Tokenize`, applied to the rows a chunk's read
yields (after partition columns and the row filter), the same in the census (`sources.census`)
and in every read (`stream.read.Reader`)."""

from __future__ import annotations

import itertools
import os
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ..errors import DataError, UnsupportedTypeError
from .encoders import Encoder, encoder_of
from .options import Tokenize, Transform

__all__ = ["TOKEN_TYPE", "Derivation"]

# The type of a tokenized column: vocabularies stay under 2**31 ids.
TOKEN_TYPE = pa.list_(pa.int32())


@dataclass(frozen=True)
class Derivation:
    """What a source computes from its rows in the loader: ``transform``, then ``tokenize``.

    Attributes:
        transform: run on each batch of a chunk's rows (it may drop rows), or ``None``.
        tokenize: adds the token column ``tokenize.output``, or ``None``.
    """

    transform: Transform | None = None
    tokenize: Tokenize | None = None
    # This process's encoder (by pid: a forked worker makes its own, `encoders.own_parallelism`).
    _encoder: dict[int, Encoder] = field(
        default_factory=dict, init=False, repr=False, compare=False
    )

    @classmethod
    def of(cls, transform: Transform | None, tokenize: Tokenize | None) -> Derivation | None:
        """The derivation of a source's options (``None``: it computes nothing)."""
        if transform is None and tokenize is None:
            return None
        return cls(transform, tokenize)

    @property
    def counts_rows(self) -> bool:
        """Whether a chunk's rows are the transform's (counted by the census), not the file's."""
        return self.transform is not None

    @property
    def identity(self) -> dict[str, str]:
        """The fingerprints that key the census, the plan and the state."""
        found = {}
        if self.tokenize is not None:
            found["tokenizer"] = self.tokenize.digest
        if self.transform is not None:
            found["transform"] = self.transform.digest
        return found

    @property
    def output(self) -> str | None:
        """The token column it adds."""
        return None if self.tokenize is None else self.tokenize.output

    def __getstate__(self) -> dict[str, Any]:  # (the encoder is made again in each process)
        return {"transform": self.transform, "tokenize": self.tokenize, "_encoder": {}}

    def __setstate__(self, state: dict[str, Any]) -> None:
        for key, value in state.items():
            object.__setattr__(self, key, value)

    def transformed(self, batch: pa.RecordBatch, where: str) -> pa.RecordBatch:
        """``batch`` through the transform (``where``: the file and chunk, for errors).

        Raises:
            DataError: the transform raised, or returned no record batch.
        """
        if self.transform is None:
            return batch
        try:
            out = self.transform.function(batch)
        except Exception as exc:
            raise DataError(
                f"{where}: the transform {self.transform.fingerprint!r} raised "
                f"{type(exc).__name__}: {exc}"
            ) from exc
        if isinstance(out, pa.Table):
            out = out.combine_chunks()
            out = pa.RecordBatch.from_arrays(
                [c.chunk(0) if c.num_chunks else pa.array([], c.type) for c in out.columns],
                schema=out.schema,
            )
        if not isinstance(out, pa.RecordBatch):
            raise DataError(
                f"{where}: the transform {self.transform.fingerprint!r} returned "
                f"{type(out).__name__}, not a pyarrow.RecordBatch"
            )
        return out

    def tokenized(self, batch: pa.RecordBatch, where: str) -> pa.RecordBatch:
        """``batch`` with the token column added (a null text: a null list).

        Raises:
            DataError: the text column is missing, or the tokenizer gave no token ids.
            UnsupportedTypeError: it does not hold strings.
        """
        tokenize = self.tokenize
        if tokenize is None:
            return batch
        names = batch.schema.names
        if tokenize.column not in names:
            raise DataError(
                f"{where}: Tokenize's column {tokenize.column!r} is not among the rows' columns "
                f"{names}"
            )
        texts = batch.column(tokenize.column)
        kind = texts.type
        if not (
            pa.types.is_string(kind)
            or pa.types.is_large_string(kind)
            or pa.types.is_string_view(kind)
        ):
            raise UnsupportedTypeError(
                f"{where}: Tokenize's column {tokenize.column!r} holds {texts.type}, not text"
            )
        ids = self._encode()(texts.to_pylist())
        tokens = _token_lists(ids, tokenize.eos_token, where)
        if tokenize.output in names:
            return batch.set_column(names.index(tokenize.output), tokenize.output, tokens)
        return batch.append_column(pa.field(tokenize.output, TOKEN_TYPE), tokens)

    def _encode(self) -> Encoder:
        pid = os.getpid()
        found = self._encoder.get(pid)
        if found is None:
            assert self.tokenize is not None
            tok = self.tokenize
            self._encoder.clear()
            found = self._encoder[pid] = encoder_of(
                tok.tokenizer, add_special_tokens=tok.add_special_tokens
            )
        return found


def _token_lists(ids: list[Any], eos: int | None, where: str) -> pa.ListArray:
    """``ids`` (a list of token ids per text, ``None`` for a null text) as an int32 list array,
    ``eos`` appended to each."""
    extra = 0 if eos is None else 1
    lengths = np.fromiter(
        (0 if one is None else len(one) + extra for one in ids), np.int64, count=len(ids)
    )
    offsets = np.zeros(len(ids) + 1, np.int64)
    np.cumsum(lengths, out=offsets[1:])
    total = int(offsets[-1])
    if total >= 2**31:
        raise DataError(f"{where}: {total} tokens in one batch: more than an int32 list holds")
    if eos is None:
        flat = itertools.chain.from_iterable(one for one in ids if one is not None)
    else:
        flat = itertools.chain.from_iterable(
            itertools.chain(one, (eos,)) for one in ids if one is not None
        )
    try:
        values = np.fromiter(flat, np.int64, count=total)
    except (TypeError, ValueError) as exc:
        raise DataError(
            f"{where}: the tokenizer gave something other than token ids: {exc}"
        ) from exc
    if total and (values.min() < 0 or values.max() >= 2**31):
        raise DataError(f"{where}: the tokenizer gave a token id outside int32: {values.max()}")
    valid = None
    if any(one is None for one in ids):
        valid = pa.array([one is not None for one in ids], pa.bool_())
    return pa.ListArray.from_arrays(
        pa.array(offsets.astype(np.int32)),
        pa.array(values.astype(np.int32)),
        type=TOKEN_TYPE,
        mask=None if valid is None else pc.invert(valid),
    )
