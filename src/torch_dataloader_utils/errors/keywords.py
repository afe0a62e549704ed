"""Keyword arguments checked before use: names a callee does not take (refused with the
closest valid name, also by the public option values' constructors: `SuggestsKeywords`),
flags that are not booleans, and options given under their earlier names (`renamed`)."""

from __future__ import annotations

import difflib
import numbers
import os
import sys
import warnings
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from inspect import Parameter, signature
from typing import Any, TypeVar

import numpy as np

from . import InvalidArgumentError, UnknownKeywordError

__all__ = [
    "SuggestsKeywords",
    "check_flags",
    "check_init_keywords",
    "check_keywords",
    "keywords_of",
    "renamed",
]

_NAMED = (Parameter.POSITIONAL_OR_KEYWORD, Parameter.KEYWORD_ONLY)
_PACKAGE = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep

_S = TypeVar("_S", bound="SuggestsKeywords")


def keywords_of(function: Callable[..., Any]) -> tuple[set[str], bool]:
    """The keyword names ``function`` takes, and whether it also takes ``**kwargs``."""
    parameters = signature(function).parameters.values()
    names = {p.name for p in parameters if p.kind in _NAMED} - {"self", "cls"}
    return names, any(p.kind is Parameter.VAR_KEYWORD for p in parameters)


def renamed(where: str, new: tuple[str, Any], old: tuple[str, Any], default: Any) -> Any:
    """The value of an option renamed from ``old`` to ``new`` (each ``(name, value)``, the
    value ``None`` when not given): the earlier name still works for a release, with a
    `DeprecationWarning` naming the new one, attributed to the caller outside this package
    (Python shows it there by default); ``default`` when neither is given.

    Raises:
        InvalidArgumentError: both names are given (``where`` names the callee).
    """
    (name, value), (old_name, earlier) = new, old
    if earlier is None:
        return default if value is None else value
    if value is not None:
        raise InvalidArgumentError(
            f"{where}: {old_name}= is the earlier name of {name}=; give {name}= alone"
        )
    warnings.warn(
        f"{where}: {old_name}= is deprecated and will be removed in a later release; use {name}=",
        DeprecationWarning,
        stacklevel=_outside_level(),
    )
    return earlier


def _outside_level() -> int:
    """The ``stacklevel`` of the first caller outside this package, seen from `renamed`."""
    frame, level = sys._getframe(2), 2
    while frame.f_back is not None and frame.f_code.co_filename.startswith(_PACKAGE):
        frame, level = frame.f_back, level + 1
    return level


def check_keywords(
    given: Iterable[str],
    accepted: Collection[str],
    *,
    refusal: str,
    also: Collection[str] = (),
    elsewhere: Mapping[str, str] | None = None,
    list_accepted: bool = False,
) -> None:
    """Refuse keywords of ``given`` that are not in ``accepted``.

    Args:
        given: the keywords passed.
        accepted: the keywords the callee takes.
        refusal: the message's start, naming the callee (``"StructuredDataset got an
            unexpected keyword argument"``); the unknown names follow.
        also: further names to suggest from (another callee's, which ``refusal`` names).
        elsewhere: keywords another callee takes, each with where it goes (``{"mixing": "a
            mixture's keyword: ..."}``), said instead of a closest name.
        list_accepted: list every accepted name in the message (a short list: a format's
            options), besides the closest one.

    Raises:
        UnknownKeywordError: a keyword is not accepted; the message names it and the closest
            valid name.
    """
    unknown = sorted(k for k in given if k not in accepted)
    if not unknown:
        return
    candidates = sorted({*accepted, *also})
    hints = []
    for name in unknown:
        if elsewhere and name in elsewhere:
            hints.append(f"{name!r} ({elsewhere[name]})")
            continue
        close = difflib.get_close_matches(name, candidates, n=1, cutoff=0.6)
        hints.append(f"{name!r}" + (f" (did you mean {close[0]!r}?)" if close else ""))
    message = f"{refusal} {', '.join(hints)}"
    if list_accepted:
        message += f"; it takes: {', '.join(sorted(accepted)) or 'none'}"
    raise UnknownKeywordError(message)


def check_flags(**flags: object) -> None:
    """Refuse flags that are not booleans: a string is truthy, so ``shuffle="no"`` would
    shuffle.

    Raises:
        InvalidArgumentError: a flag is not a ``bool`` (numpy's included).
    """
    for name, value in flags.items():
        if not isinstance(value, bool | np.bool_):
            raise InvalidArgumentError(f"{name} must be True or False, got {value!r}")


def check_init_keywords(
    cls: type,
    kwargs: Mapping[str, Any],
    *,
    also: Sequence[str] = (),
    elsewhere: Mapping[str, str] | None = None,
) -> None:
    """Refuse keywords that ``cls.__init__`` does not take, naming the closest valid one (of
    the class, or ``also``: the loader's, which `create_dataloader` takes besides), or for
    one of ``elsewhere``, where it goes (`check_keywords`). A class whose ``__init__`` takes
    ``**kwargs`` checks its own.

    Raises:
        UnknownKeywordError: a keyword the class does not take.
    """
    accepted, anything = keywords_of(cls.__init__)  # type: ignore[misc]
    if anything or kwargs.keys() <= accepted:
        return
    named = f"create_dataloader and {cls.__name__}" if also else cls.__name__
    check_keywords(
        kwargs,
        accepted,
        refusal=f"{named} got an unexpected keyword argument",
        also=also,
        elsewhere=elsewhere,
    )


class SuggestsKeywords:
    """A base whose constructor refuses a keyword its ``__init__`` does not take, naming the
    closest valid one, as `create_dataloader` does (``tdu.Source(wieght=2)``: did you mean
    'weight'?). A dataclass stays one: the check runs in ``__new__``, before the generated
    ``__init__`` binds the keywords (Python's own error would name no valid one).

    Raises:
        UnknownKeywordError: a keyword the class does not take.
    """

    __slots__ = ()

    def __new__(cls: type[_S], *args: Any, **kwargs: Any) -> _S:
        if kwargs:
            check_init_keywords(cls, kwargs)
        return super().__new__(cls)


def check_positive(**values: object) -> None:
    """Refuse a value that is not a positive integer (``None``: not given).

    Raises:
        InvalidArgumentError: one is not, named.
    """
    for name, value in values.items():
        if value is not None and (
            isinstance(value, bool) or not isinstance(value, numbers.Integral) or value <= 0
        ):
            raise InvalidArgumentError(f"{name} must be a positive integer, got {value!r}")


def refuse_rebatching(
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
