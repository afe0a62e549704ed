"""Per-value decoders a format asks for (WebDataset's ``json``, ``npy``, images), applied in the
worker after conversion, so that only bytes travel through Arrow.

A decoded column whose values are all tensors (``output_format="torch"``) or arrays
(``"numpy"``) of one shape and dtype is stacked into one; otherwise it stays a list, one value
per row. ``"dict"`` output keeps lists; ``"arrow"`` output is not decoded.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

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
    """

    decoders: Mapping[str, Decoder]
    output_format: str
    collate: Callable[[Any], Any] | None = None

    def __call__(self, batch: Any) -> Any:
        if isinstance(batch, dict):
            for name, decode in self.decoders.items():
                values = batch.get(name)
                if isinstance(values, list):
                    batch[name] = _stack([decode(v) for v in values], self.output_format)
        return batch if self.collate is None else self.collate(batch)
