"""Raw-text corpora for the tokenizing tests, a real `tokenizers` tokenizer over them, and the
one-process oracle the loader is checked against.

Every word of a corpus is unique and the tokenizer is word-level with a word's id following the
word before it, so a document's tokens are consecutive ids and every token id occurs once in
the corpus: the multiset of ids read says which tokens were read and how often, and an id tells
its document and position (`tests.packed_data.tokens_of` checks packed batches with it). The
words carry multi-byte characters. The oracle tokenizes every text in one process; the tests
compare what the loader read with it, never with how the corpus was built.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from tokenizers import Tokenizer, models, pre_tokenizers

EOS = 1  # the tokenizer's "[EOS]" id
PREFIXES = ("w", "é", "漢字", "🙂")  # 1, 2, 3 and 4 bytes a character in UTF-8
ROW_GROUP = 7


@dataclass
class Corpus:
    """A corpus written as Parquet: ``texts[id]`` (``None``: null) and ``titles[id]`` by row
    id, the files under ``root``, and the tokenizer over its words."""

    root: Path
    texts: dict[int, str | None]
    titles: dict[int, str]
    keep: dict[int, bool]
    tokenizer: Tokenizer


def word_tokenizer(words: list[str]) -> Tokenizer:
    """A word-level tokenizer: ``words[k]`` is id ``k + 2`` (0: unknown, 1: EOS)."""
    vocab = {"[UNK]": 0, "[EOS]": EOS, **{w: k + 2 for k, w in enumerate(words)}}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return tok


def write_corpus(
    root: Path,
    *,
    files: int = 3,
    per_file: int = 40,
    longest: int = 30,
    long_words: int = 0,
    seed: int = 7,
    dropped_group: tuple[int, int] | None = None,
) -> Corpus:
    """``files`` Parquet files of ``per_file`` rows: ``id``, ``title`` (one word), ``text`` (0
    to ``longest - 1`` words; some empty, some null, row 1 of each file empty and row 2 null;
    row 0 ``long_words`` words when given) and ``keep`` (false for a tenth of the rows, and
    for every row of row group ``dropped_group = (file, group)``)."""
    root.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    words: list[str] = []
    texts: dict[int, str | None] = {}
    titles: dict[int, str] = {}
    keep: dict[int, bool] = {}

    def word() -> str:
        k = len(words)
        words.append(f"{PREFIXES[k % len(PREFIXES)]}{k}")
        return words[-1]

    row = 0
    for f in range(files):
        ids, title_col, text_col, keep_col = [], [], [], []
        for r in range(per_file):
            titles[row] = word()
            n = long_words if (r == 0 and long_words) else int(rng.integers(0, longest))
            n = 0 if r in (1, 2) else n  # (row 1 of a file empty, row 2 null)
            if n == 0 and (r == 2 or rng.random() < 0.4):
                texts[row] = None
            else:
                texts[row] = ("  " if rng.random() < 0.2 else " ").join(word() for _ in range(n))
            dropped = dropped_group is not None and (f, r // ROW_GROUP) == dropped_group
            keep[row] = not dropped and rng.random() >= 0.1
            ids.append(row)
            title_col.append(titles[row])
            text_col.append(texts[row])
            keep_col.append(keep[row])
            row += 1
        table = pa.table(
            {
                "id": pa.array(ids, pa.int64()),
                "title": pa.array(title_col, pa.string()),
                "text": pa.array(text_col, pa.string()),
                "keep": pa.array(keep_col, pa.bool_()),
            }
        )
        pq.write_table(table, root / f"part-{f}.parquet", row_group_size=ROW_GROUP)
    return Corpus(root, texts, titles, keep, word_tokenizer(words))


def titled(batch: pa.RecordBatch) -> pa.RecordBatch:
    """The test's transform: the rows to keep, each text after its title (a null text stays
    null), as ``id`` and ``text``."""
    kept = batch.filter(batch.column("keep"))
    text = pc.binary_join_element_wise(kept.column("title"), kept.column("text"), " ")
    return pa.RecordBatch.from_arrays([kept.column("id"), text], names=["id", "text"])


def oracle(
    corpus: Corpus, *, transform: bool = False, eos: bool = False
) -> dict[int, list[int] | None]:
    """Every row's tokens (a null text: ``None``), the whole corpus tokenized in one process,
    after the transform (`titled`) when ``transform``: only the rows it keeps."""
    texts: dict[int, str | None] = {}
    for i, text in corpus.texts.items():
        if not transform:
            texts[i] = text
        elif corpus.keep[i]:
            texts[i] = None if text is None else f"{corpus.titles[i]} {text}"
    given = [i for i, t in texts.items() if t is not None]
    encoded = corpus.tokenizer.encode_batch([texts[i] for i in given], add_special_tokens=False)
    out: dict[int, list[int] | None] = dict.fromkeys(texts)
    for i, e in zip(given, encoded, strict=True):
        out[i] = [*e.ids, EOS] if eos else list(e.ids)
    return out


def where_of(tokens: dict[int, list[int] | None]) -> dict[int, tuple[int, int]]:
    """Each token id's (row id, position), from the oracle's tokens (ids unique: no EOS)."""
    where: dict[int, tuple[int, int]] = {}
    for i, ids in tokens.items():
        for p, t in enumerate(ids or ()):
            assert t not in where and t > EOS, "the corpus's token ids are unique"
            where[t] = (i, p)
    return where


def all_tokens(tokens: dict[int, list[int] | None]) -> list[int]:
    return [t for ids in tokens.values() for t in ids or ()]


class Counting:
    """A corpus's tokenizer as a plain callable, counting the texts it is given."""

    def __init__(self, corpus: Corpus) -> None:
        self.tokenizer = corpus.tokenizer
        self.texts = 0

    def __call__(self, texts: list[str]) -> list[list[int]]:
        self.texts += len(texts)
        return [e.ids for e in self.tokenizer.encode_batch(texts, add_special_tokens=False)]
