"""Keyword arguments checked before use (`errors.keywords`): an unknown name refused with the
closest valid one (or where it goes), flags that are not booleans, values that are not positive
integers, DataLoader options that would re-batch; through the public API: test_mistakes.py."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import pytest

from torch_dataloader_utils.errors import InvalidArgumentError, UnknownKeywordError
from torch_dataloader_utils.errors.keywords import (
    SuggestsKeywords,
    check_flags,
    check_keywords,
    check_positive,
    keywords_of,
    refuse_rebatching,
    renamed,
)


def test_a_renamed_option_takes_either_name_and_warns_at_the_caller() -> None:
    assert renamed("f", ("new", None), ("old", None), 7) == 7
    assert renamed("f", ("new", 3), ("old", None), 7) == 3
    with pytest.warns(DeprecationWarning, match="f: old= is deprecated.*use new=") as seen:
        assert renamed("f", ("new", None), ("old", 5), 7) == 5
    assert seen[0].filename == __file__  # (shown by default: outside the library)
    with pytest.raises(InvalidArgumentError, match="old= is the earlier name of new="):
        renamed("f", ("new", 3), ("old", 5), 7)


def test_the_keywords_of_a_function_and_whether_it_takes_any() -> None:
    def f(self: Any, a: int, /, b: int, *args: Any, c: int = 0, **kwargs: Any) -> None: ...

    assert keywords_of(f) == ({"b", "c"}, True)
    assert keywords_of(lambda x, *, y: None) == ({"x", "y"}, False)


def test_an_unknown_keyword_names_the_closest_or_where_it_goes() -> None:
    refuse = "f got an unexpected keyword argument"
    check_keywords(["batch_size"], {"batch_size", "shuffle"}, refusal=refuse)
    with pytest.raises(
        UnknownKeywordError, match=r"^f got .* 'shufle' \(did you mean 'shuffle'\?\)$"
    ):
        check_keywords(["shufle"], {"batch_size", "shuffle"}, refusal=refuse)
    with pytest.raises(UnknownKeywordError, match=r"'workers' \(did you mean 'num_workers'\?\)"):
        check_keywords(["workers"], {"shuffle"}, refusal=refuse, also={"num_workers"})
    with pytest.raises(UnknownKeywordError, match=r"'mixing' \(a mixture's keyword\)"):
        check_keywords(
            ["mixing"], {"shuffle"}, refusal=refuse, elsewhere={"mixing": "a mixture's keyword"}
        )
    with pytest.raises(UnknownKeywordError, match=r"'zzz'; it takes: a, b$"):
        check_keywords(["zzz"], {"b", "a"}, refusal=refuse, list_accepted=True)


def test_flags_and_positive_integers() -> None:
    check_flags(shuffle=True, drop_last=np.bool_(False))
    with pytest.raises(InvalidArgumentError, match="shuffle must be True or False, got 'no'"):
        check_flags(shuffle="no")
    check_positive(batch_size=8, split_rows=None, n=np.int64(2))
    for value in (0, -1, 1.5, True):
        with pytest.raises(InvalidArgumentError, match="batch_size must be a positive integer"):
            check_positive(batch_size=value)


@dataclass(frozen=True)
class Weighted(SuggestsKeywords):
    weight: float = 1.0


def test_an_option_value_refuses_a_misspelled_keyword_and_stays_a_dataclass() -> None:
    assert Weighted(weight=2).weight == 2 and Weighted(3).weight == 3
    with pytest.raises(UnknownKeywordError, match=r"'wieght' \(did you mean 'weight'\?\)"):
        Weighted(wieght=2)  # type: ignore[call-arg]


def test_dataloader_options_that_would_rebatch_are_refused_together() -> None:
    none: dict[str, Any] = dict(batch_size=None, sampler=None, batch_sampler=None, collate_fn=None)
    refuse_rebatching(**none, shuffle=None, drop_last=False)
    with pytest.raises(InvalidArgumentError, match=r"take batch_size=8, shuffle=True, drop_last"):
        refuse_rebatching(**{**none, "batch_size": 8}, shuffle=True, drop_last=True)
