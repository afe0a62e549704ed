"""The keywords each dataset takes, checked once, where they arrive: in the dataset's
constructor (`PlannedDataset.__new__`), which `create_dataloader` and the classes'
``create_dataloader`` reach too.

The names come from the fields of the option values (`Source`, `Options`; the loader's
`LoaderOptions` are suggested when one is misspelt), so an option is taken wherever its value
is, and a class's signature is its documentation, not a second list (a test holds them equal).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from ..errors.keywords import check_keywords, keywords_of
from ..options import EVERY_SOURCE, LOADER_KEYWORDS, OPTION_KEYWORDS, Source, source_keywords

__all__ = ["MIXTURE_KEYWORDS", "check_dataset_keywords", "dataset_keywords"]

# A mixture's own keywords (its sources, and how they share the epoch).
MIXTURE_KEYWORDS = frozenset(
    {"sources", "epoch_rows", "mixing", "source_column", "weights_schedule"}
)

# `create_dataloader`'s own keywords: suggested when a dataset's keyword is misspelt.
_CREATE = frozenset({*LOADER_KEYWORDS, "source", "path", "format", "dataset_class"})

# Every `Source` field: given to a mixture, one that its sources set one by one.
_SOURCE_FIELDS = frozenset(f.name for f in dataclasses.fields(Source))

_NEEDS_MIXTURE = (
    "a mixture's keyword: it needs a list of tdu.Source as the source, "
    "e.g. [tdu.Source(path_a), tdu.Source(path_b)]"
)
_OF_ONE_SOURCE = "an option of one source of a mixture: give it in that tdu.Source"


def dataset_keywords(reads: str) -> frozenset[str]:
    """The keywords a dataset of ``reads`` (``"files"``, ``"table"`` or ``"mixture"``) takes:
    the `Options`, and a source's (`Source` of that kind; a mixture's own and, for every
    source that leaves them unset, `EVERY_SOURCE`)."""
    if reads == "mixture":
        return MIXTURE_KEYWORDS | OPTION_KEYWORDS | frozenset(EVERY_SOURCE)
    return source_keywords(reads) | OPTION_KEYWORDS


def check_dataset_keywords(cls: type, reads: str, given: Mapping[str, Any]) -> None:
    """Refuse a keyword that ``cls`` (a dataset of ``reads``) does not take, naming the
    closest valid one, or where it goes (a mixture's keyword given with one source, a
    source's given to a mixture). A subclass's own named keywords are taken too.

    Raises:
        UnknownKeywordError: a keyword the dataset does not take.
    """
    accepted = dataset_keywords(reads) | keywords_of(cls.__init__)[0]  # type: ignore[misc]
    if given.keys() <= accepted:
        return
    if reads == "mixture":
        elsewhere = dict.fromkeys(_SOURCE_FIELDS, _OF_ONE_SOURCE)
    else:
        elsewhere = dict.fromkeys(MIXTURE_KEYWORDS - {"sources"}, _NEEDS_MIXTURE)
    check_keywords(
        given,
        accepted,
        refusal=f"{cls.__name__} got an unexpected keyword argument",
        also=_CREATE,
        elsewhere={k: v for k, v in elsewhere.items() if k not in accepted},
    )
