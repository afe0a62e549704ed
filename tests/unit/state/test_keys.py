"""Reading a loader state strictly (`state.keys.checked`): a mapping with exactly the keys named,
else a refusal that says which keys are missing or unknown."""

from __future__ import annotations

import pytest

from torch_dataloader_utils.errors import StateMismatchError
from torch_dataloader_utils.state.keys import LOADER_KEYS, STREAM_KEYS, checked


def test_a_mapping_with_the_keys_named_is_given_back() -> None:
    value = {"a": 1, "b": 2}
    assert checked(value, ["a", "b"], "the state") is value
    assert checked({"a": 1, "c": 3}, ["a"], "the state", optional=["c"]) == {"a": 1, "c": 3}


@pytest.mark.parametrize(
    ("value", "said"),
    [
        ({"a": 1}, r"the state has keys missing \['b'\]"),
        ({"a": 1, "b": 2, "z": 0}, r"the state has keys unknown \['z'\]"),
        ({"a": 1, "z": 0}, r"missing \['b'\] and unknown \['z'\]"),
        ([("a", 1), ("b", 2)], "the state is a list, not a mapping"),
    ],
)
def test_anything_else_is_refused_saying_why(value: object, said: str) -> None:
    with pytest.raises(StateMismatchError, match=said) as info:
        checked(value, ["a", "b"], "the state")
    assert "loader.state_dict()" in str(info.value)


def test_a_streams_state_holds_the_loaders_keys() -> None:
    assert LOADER_KEYS < STREAM_KEYS
