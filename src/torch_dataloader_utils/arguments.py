"""Checks of the dataset's arguments, before anything is listed or read."""

from __future__ import annotations

import numbers
from collections.abc import Sequence

from .errors import InvalidArgumentError
from .planning import REMAINDER_POLICIES, SPLIT_STRATEGIES
from .skipping import ON_ERROR

__all__ = ["check_arguments"]


def check_arguments(
    *,
    batch_size: int,
    columns: Sequence[str] | None,
    shuffle_seed: int,
    split_bytes: int | None,
    split_rows: int | None,
    partitioning: str | None,
    shuffle_block_size: int | None,
    shuffle_block_bytes: int,
    world_size: int | None,
    remainder: str,
    split_strategy: str,
    num_ranks: int | None,
    on_error: str = "raise",
) -> int | None:
    """Check `StructuredDataset`'s arguments; returns ``world_size`` (``num_ranks``, the
    earlier library's name for it, when only that is given).

    Raises:
        InvalidArgumentError: an argument is out of range or of the wrong kind.
    """
    if num_ranks is not None:  # the earlier library's name for world_size
        if world_size is not None and world_size != num_ranks:
            raise InvalidArgumentError(
                f"num_ranks={num_ranks} and world_size={world_size} disagree; pass one"
            )
        world_size = num_ranks
    _check_positive(batch_size=batch_size, shuffle_block_bytes=shuffle_block_bytes)
    _check_positive(split_bytes=split_bytes, split_rows=split_rows)
    _check_positive(shuffle_block_size=shuffle_block_size)
    if shuffle_seed < 0:
        raise InvalidArgumentError(f"shuffle_seed must be >= 0, got {shuffle_seed}")
    if remainder not in REMAINDER_POLICIES:
        raise InvalidArgumentError(
            f"remainder must be one of {REMAINDER_POLICIES}, got {remainder!r}"
        )
    if split_strategy not in SPLIT_STRATEGIES:
        raise InvalidArgumentError(
            f"split_strategy must be one of {SPLIT_STRATEGIES}, got {split_strategy!r}"
        )
    if on_error not in ON_ERROR:
        raise InvalidArgumentError(f"on_error must be one of {ON_ERROR}, got {on_error!r}")
    if partitioning not in (None, "hive"):
        raise InvalidArgumentError(f'partitioning must be None or "hive", got {partitioning!r}')
    if isinstance(columns, str):
        raise InvalidArgumentError(f"columns must be a list of names, got the string {columns!r}")
    return world_size


def _check_positive(**values: object) -> None:
    for name, value in values.items():
        if value is not None and (
            isinstance(value, bool) or not isinstance(value, numbers.Integral) or value <= 0
        ):
            raise InvalidArgumentError(f"{name} must be a positive integer, got {value!r}")
