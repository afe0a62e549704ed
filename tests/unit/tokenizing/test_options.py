"""`Tokenize` and `Transform`: checked when made, and the fingerprints that key the census and
the state say when the tokens would differ."""

from __future__ import annotations

import os

import pytest
from tokenizers import Tokenizer
from transformers import PreTrainedTokenizerFast

import torch_dataloader_utils as tdu
from tests.text_data import word_tokenizer


def test_a_tokenizer_is_fingerprinted_by_its_vocabulary_and_rules() -> None:
    one, same, other = word_tokenizer(["a", "b"]), word_tokenizer(["a", "b"]), word_tokenizer(["a"])
    assert tdu.Tokenize("text", one).digest == tdu.Tokenize("text", same).digest
    assert tdu.Tokenize("text", one).digest != tdu.Tokenize("text", other).digest
    # What it appends and adds changes the tokens too.
    assert tdu.Tokenize("text", one).digest != tdu.Tokenize("text", one, eos_token=1).digest
    assert (
        tdu.Tokenize("text", one).digest
        != tdu.Tokenize("text", one, add_special_tokens=True).digest
    )
    # (Where the tokens go does not.)
    assert tdu.Tokenize("text", one).digest == tdu.Tokenize("text", one, output="ids").digest


def test_a_transformers_tokenizer_is_fingerprinted_by_its_backend() -> None:
    backend = word_tokenizer(["a", "b"])
    wrapped = PreTrainedTokenizerFast(tokenizer_object=backend)
    again = PreTrainedTokenizerFast(tokenizer_object=Tokenizer.from_str(backend.to_str()))
    assert tdu.Tokenize("text", wrapped).digest == tdu.Tokenize("text", again).digest
    other = PreTrainedTokenizerFast(tokenizer_object=word_tokenizer(["a", "c"]))
    assert tdu.Tokenize("text", wrapped).digest != tdu.Tokenize("text", other).digest


def test_a_plain_callable_needs_a_fingerprint() -> None:
    def split(texts: list[str]) -> list[list[int]]:
        return [[len(w) for w in t.split()] for t in texts]

    with pytest.raises(tdu.InvalidArgumentError, match=r'fingerprint="\.\.\."'):
        tdu.Tokenize("text", split)
    named = tdu.Tokenize("text", split, fingerprint="lengths-v1")
    assert named.digest != tdu.Tokenize("text", split, fingerprint="lengths-v2").digest


@pytest.mark.parametrize(
    ("given", "match"),
    [
        ({"column": ""}, "column must be a name"),
        ({"output": "text"}, "would replace its text column"),
        ({"eos_token": -1}, "eos_token must be a token id"),
        ({"eos_token": True}, "eos_token must be a token id"),
        ({"add_special_tokens": 1}, "add_special_tokens must be True or False"),
        ({"tokenizer": 3}, "tokenizer must be a tokenizers.Tokenizer"),
        ({"fingerprint": ""}, "fingerprint must be a non-empty string"),
    ],
)
def test_wrong_options_are_refused_when_made(given: dict[str, object], match: str) -> None:
    options = {"column": "text", "tokenizer": word_tokenizer(["a"]), **given}
    with pytest.raises(tdu.InvalidArgumentError, match=match):
        tdu.Tokenize(**options)  # type: ignore[arg-type]


def test_a_transform_needs_a_function_and_a_fingerprint() -> None:
    with pytest.raises(tdu.InvalidArgumentError, match="must be callable"):
        tdu.Transform(3, fingerprint="x")  # type: ignore[arg-type]
    with pytest.raises(tdu.InvalidArgumentError, match="non-empty string"):
        tdu.Transform(lambda b: b, fingerprint="")
    assert tdu.Transform(len, "a").digest != tdu.Transform(len, "b").digest
    with pytest.raises(tdu.InvalidArgumentError, match=r"wrap it: tdu.Transform\(function"):
        tdu.Source("data/", transform=lambda b: b)  # type: ignore[arg-type]
    with pytest.raises(tdu.InvalidArgumentError, match=r"tokenize must be a tdu\.Tokenize"):
        tdu.Source("data/", tokenize="text")  # type: ignore[arg-type]


def test_making_one_turns_the_tokenizers_pool_off_unless_the_user_chose(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("TOKENIZERS_PARALLELISM", raising=False)
    tdu.Tokenize("text", word_tokenizer(["a"]))
    assert os.environ["TOKENIZERS_PARALLELISM"] == "false"
    monkeypatch.setenv("TOKENIZERS_PARALLELISM", "true")
    tdu.Tokenize("text", word_tokenizer(["a"]))
    assert os.environ["TOKENIZERS_PARALLELISM"] == "true"
