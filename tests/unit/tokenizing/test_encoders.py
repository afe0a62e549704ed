"""`encoder_of`: the same token ids from a `tokenizers.Tokenizer`, a transformers tokenizer (its
backend) and a plain callable; a null text stays null."""

from __future__ import annotations

from transformers import PreTrainedTokenizerFast

from tests.text_data import word_tokenizer
from torch_dataloader_utils.tokenizing import encoder_of

TEXTS = ["b a", None, "", "a  c z", "c"]


def expected(add_special_tokens: bool) -> list[list[int] | None]:
    tok = word_tokenizer(["a", "b", "c"])
    return [
        None if t is None else tok.encode(t, add_special_tokens=add_special_tokens).ids
        for t in TEXTS
    ]


def test_a_tokenizers_tokenizer_gives_each_text_its_ids() -> None:
    encode = encoder_of(word_tokenizer(["a", "b", "c"]), add_special_tokens=False)
    assert encode(TEXTS) == expected(False) == [[3, 2], None, [], [2, 4, 0], [4]]


def test_a_transformers_tokenizer_gives_the_same_ids() -> None:
    wrapped = PreTrainedTokenizerFast(tokenizer_object=word_tokenizer(["a", "b", "c"]))
    assert encoder_of(wrapped, add_special_tokens=False)(TEXTS) == expected(False)


def test_a_callable_gets_the_texts_that_are_not_null() -> None:
    seen: list[list[str]] = []

    def lengths(texts: list[str]) -> list[list[int]]:
        seen.append(list(texts))
        return [[len(t)] for t in texts]

    assert encoder_of(lengths, add_special_tokens=False)(TEXTS) == [[3], None, [0], [6], [1]]
    assert seen == [["b a", "", "a  c z", "c"]]
