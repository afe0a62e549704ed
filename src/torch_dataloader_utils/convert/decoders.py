"""Per-value decoders a format asks for (WebDataset's ``json``, ``npy``, images), applied in the
worker after conversion, so that only bytes travel through Arrow.

A decoded column whose values are all tensors (``output_format="torch"``) or arrays
(``"numpy"``) of one shape and dtype is stacked into one; otherwise it stays a list, one value
per row. ``"dict"`` output keeps lists; ``"arrow"`` output is not decoded.
"""

from __future__ import annotations

import pickle
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from ..errors import CorruptFileError, DataError
from ..errors.on_error import FailureLog, OnError, ReadFailure

__all__ = ["Decoder", "Decoding"]

Decoder = Callable[[Any], Any]


def _stack(values: list[Any], output_format: str) -> Any:
    if not values:
        return values
    first = values[0]
    if output_format == "torch" and isinstance(first, torch.Tensor):
        same = all(
            isinstance(v, torch.Tensor) and v.shape == first.shape and v.dtype == first.dtype
            for v in values
        )
        return torch.stack(values) if same else values
    if output_format in ("torch", "numpy") and isinstance(first, np.ndarray):
        same = all(
            isinstance(v, np.ndarray) and v.shape == first.shape and v.dtype == first.dtype
            for v in values
        )
        if not same:
            return values
        stacked = np.stack(values)
        return torch.from_numpy(stacked) if output_format == "torch" else stacked
    return values


@dataclass(frozen=True)
class Decoding:
    """Applies ``decoders`` (column name → function of one value) to converted batches.

    Attributes:
        decoders: the decoder of each column; columns absent from a batch are left alone.
        output_format: the loader's output format (decides stacking).
        collate: the user's ``collate_fn``, applied after decoding.
        carried: columns read only to name a sample in errors (WebDataset's ``__url__`` and
            ``__key__`` when not asked for): dropped once the batch is decoded.
    """

    decoders: Mapping[str, Decoder]
    output_format: str
    collate: Callable[[Any], Any] | None = None
    on_error: OnError = "raise"
    failures: FailureLog | None = None
    carried: tuple[str, ...] = ()

    def __call__(self, batch: Any) -> Any:
        if isinstance(batch, dict):
            decoded: dict[str, list[Any]] = {}
            bad: dict[int, Exception] = {}  # rows that do not decode (on_error="skip")
            for name, decode in self.decoders.items():
                values = batch.get(name)
                if isinstance(values, list):
                    decoded[name] = self._decoded(batch, name, decode, values, bad)
            if bad:
                self._replace(batch, decoded, bad)
            for name, values in decoded.items():
                batch[name] = _stack(values, self.output_format)
            for name in self.carried:
                batch.pop(name, None)
        return batch if self.collate is None else self.collate(batch)

    def _decoded(
        self,
        batch: dict[str, Any],
        name: str,
        decode: Decoder,
        values: list[Any],
        bad: dict[int, Exception],
    ) -> list[Any]:
        out = []
        for row, value in enumerate(values):
            try:
                out.append(decode(value))
            except _BAD_VALUE as exc:
                error = _decode_error(batch, name, row, exc)
                if self.on_error == "raise":
                    raise error from exc
                bad.setdefault(row, error)
                out.append(None)
            except Exception as exc:  # a bug in a decoder, not a bad value: keep its type
                if hasattr(exc, "add_note"):  # (Python 3.11+; on 3.10 the error goes unnoted)
                    exc.add_note(f"while decoding {_where(batch, name, row)}")
                raise
        return out

    def _replace(
        self, batch: dict[str, Any], decoded: dict[str, list[Any]], bad: dict[int, Exception]
    ) -> None:
        """Put a copy of the nearest good row (before, else after) in each bad row's place,
        every column of it (a sample's image and label stay together)."""
        rows = len(next(iter(decoded.values())))
        good = [r for r in range(rows) if r not in bad]
        first = next(iter(bad.values()))
        if not good:
            raise type(first)(
                f"{first} (on_error='skip' could not replace the batch's {rows} samples: none "
                "of them decodes)"
            )
        columns: dict[str, Any] = {**batch, **decoded}
        for name, values in columns.items():
            if isinstance(values, torch.Tensor | np.ndarray) and values.shape[:1] == (rows,):
                columns[name] = values.copy() if isinstance(values, np.ndarray) else values.clone()
            elif not (isinstance(values, list) and len(values) == rows):
                raise type(first)(
                    f"{first} (on_error='skip' cannot replace the sample: column {name!r} is "
                    "not one value per sample)"
                )
        urls = batch.get("__url__")
        for row, error in bad.items():
            if self.failures is not None:  # named before the row is replaced
                self.failures.add(
                    ReadFailure(
                        file=str(urls[row]) if isinstance(urls, list) else "",
                        rows=_sample(batch, row),
                        skipped=1,
                        error=type(error).__name__,
                        message=str(error),
                    )
                )
        for row in bad:
            donor = max((g for g in good if g < row), default=good[0])
            for values in columns.values():
                values[row] = values[donor]
        for name, values in columns.items():
            (decoded if name in decoded else batch)[name] = values


# What bad bytes raise in decoders (json: ValueError; numpy: ValueError, EOFError; Pillow:
# OSError; pickle: UnpicklingError; text: UnicodeDecodeError, a ValueError).
_BAD_VALUE = (DataError, ValueError, OSError, EOFError, pickle.UnpicklingError)


def _sample(batch: dict[str, Any], row: int) -> str:
    keys = batch.get("__key__")
    return f"sample {keys[row]!r}" if isinstance(keys, list) else f"row {row} of a batch"


def _where(batch: dict[str, Any], name: str, row: int) -> str:
    """The sample a value belongs to, when the batch says which (WebDataset's ``__url__`` and
    ``__key__`` columns)."""
    urls, keys = batch.get("__url__"), batch.get("__key__")
    if isinstance(urls, list) and isinstance(keys, list):
        return f"{urls[row]}: sample {keys[row]!r}, column {name!r}"
    return f"column {name!r}, row {row} of a batch"


def _decode_error(batch: dict[str, Any], name: str, row: int, exc: Exception) -> Exception:
    """The error of a value that does not decode."""
    where = _where(batch, name, row)
    if isinstance(exc, DataError):
        return type(exc)(f"{where}: {exc}")
    return CorruptFileError(f"{where}: the value does not decode ({type(exc).__name__}: {exc})")
