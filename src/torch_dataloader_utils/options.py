"""Every argument check of the dataset and the loader, before anything is listed or read."""

from __future__ import annotations

import numbers
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from .errors import InvalidArgumentError
from .fs import Source
from .keywords import check_flags, check_keywords, keywords_of
from .planning import REMAINDER_POLICIES, SPLIT_STRATEGIES
from .skipping import ON_ERROR

__all__ = [
    "check_arguments",
    "check_dataloader_options",
    "check_dataset_keywords",
    "check_loader_arguments",
]


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
    shuffle: bool = False,
    drop_last: bool = False,
) -> int | None:
    """Check `StructuredDataset`'s arguments; returns ``world_size`` (``num_ranks``, the
    earlier library's name for it, when only that is given).

    Raises:
        InvalidArgumentError: an argument is out of range or of the wrong kind (a flag that is
            not a bool, ``columns`` that is not a non-empty list of names).
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
    check_flags(shuffle=shuffle, drop_last=drop_last)
    _check_columns(columns)
    return world_size


def _check_columns(columns: Sequence[str] | None) -> None:
    if columns is None:
        return
    if isinstance(columns, str):
        raise InvalidArgumentError(f"columns must be a list of names, got the string {columns!r}")
    if not isinstance(columns, Sequence):  # (an iterator would be used up by this check)
        raise InvalidArgumentError(f"columns must be a list of names, got {type(columns).__name__}")
    names = list(columns)
    if not names:  # an empty list reads no column: surely a mistake (None reads them all)
        raise InvalidArgumentError("columns must name at least one column (None: all of them)")
    bad = [c for c in names if not isinstance(c, str)]
    if bad:
        raise InvalidArgumentError(f"columns must be names (str), got {bad[0]!r}")


def check_dataset_keywords(
    cls: type, kwargs: Mapping[str, Any], *, caller: Callable[..., Any] | None = None
) -> None:
    """Refuse keywords that ``cls.__init__`` does not take, naming the closest valid one (of
    the class, or of ``caller``, which passes the others on to the class: `create_dataloader`).
    A class whose ``__init__`` takes ``**kwargs`` checks its own.

    Raises:
        UnknownKeywordError: a keyword the class does not take.
    """
    accepted, anything = keywords_of(cls.__init__)  # type: ignore[misc]
    if anything or kwargs.keys() <= accepted:
        return
    also, _ = keywords_of(caller) if caller is not None else (set(), False)
    named = f"{caller.__name__} and {cls.__name__}" if caller is not None else cls.__name__
    check_keywords(
        kwargs, accepted, refusal=f"{named} got an unexpected keyword argument", also=also
    )


def _check_positive(**values: object) -> None:
    for name, value in values.items():
        if value is not None and (
            isinstance(value, bool) or not isinstance(value, numbers.Integral) or value <= 0
        ):
            raise InvalidArgumentError(f"{name} must be a positive integer, got {value!r}")


def check_loader_arguments(
    *,
    source: Source | None,
    path: Source | None,
    num_workers: int,
    bundle_rows: int,
    persistent_workers: bool,
    pin_memory: bool = False,
) -> Source:
    """Check `create_dataloader`'s own arguments; returns the data to read.

    Raises:
        InvalidArgumentError: an option is out of range, or the data is given twice or not at
            all.
    """
    check_flags(persistent_workers=persistent_workers, pin_memory=pin_memory)
    if num_workers < 0:
        raise InvalidArgumentError(f"num_workers must be >= 0, got {num_workers}")
    if bundle_rows < 0:
        raise InvalidArgumentError(f"bundle_rows must be >= 0, got {bundle_rows}")
    data = source if source is not None else path
    if data is None or (source is not None and path is not None):
        raise InvalidArgumentError("pass the data as source (or path=), exactly once")
    if persistent_workers and num_workers == 0:
        raise InvalidArgumentError("persistent_workers=True needs num_workers > 0")
    return data


def check_dataloader_options(
    *,
    batch_size: int | None,
    sampler: Any,
    batch_sampler: Any,
    collate_fn: Callable[[Any], Any] | None,
    shuffle: bool | None,
    drop_last: bool,
) -> None:
    """Refuse DataLoader options that would re-batch or re-order what the dataset yields
    (``TabularDataLoader``'s own sampler and collate function are passed as ``None``).

    Raises:
        InvalidArgumentError: one of them is set.
    """
    problems = []
    if batch_size is not None:
        problems.append(f"batch_size={batch_size}")
    if sampler is not None:
        problems.append(f"sampler={sampler!r}")
    if batch_sampler is not None:
        problems.append(f"batch_sampler={batch_sampler!r}")
    if collate_fn is not None:
        problems.append(f"collate_fn={collate_fn!r}")
    if shuffle:
        problems.append("shuffle=True")
    if drop_last:
        problems.append("drop_last=True")
    if problems:
        raise InvalidArgumentError(
            f"TabularDataLoader does not take {', '.join(problems)}: the dataset yields whole "
            "batches, already shuffled and cut for this rank. Pass batch_size, shuffle, "
            "drop_last and collate_fn to create_dataloader (or the dataset) instead"
        )
