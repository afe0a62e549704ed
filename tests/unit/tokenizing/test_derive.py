"""`Derivation`: a transform, then the token column, on one record batch; what goes wrong names
where."""

from __future__ import annotations

import pyarrow as pa
import pytest

import torch_dataloader_utils as tdu
from tests.text_data import word_tokenizer
from torch_dataloader_utils.tokenizing import Derivation

TOK = word_tokenizer(["a", "b", "é漢🙂"])
BATCH = pa.RecordBatch.from_pydict(
    {"id": [0, 1, 2, 3], "text": ["a b", None, "", "é漢🙂 a"], "keep": [True, False, True, True]}
)


def test_tokens_are_added_as_int32_lists_a_null_text_a_null_list() -> None:
    derive = Derivation(None, tdu.Tokenize("text", TOK, eos_token=1))
    out = derive.tokenized(BATCH, "here")
    assert out.schema.field("tokens").type == pa.list_(pa.int32())
    assert out.column("tokens").to_pylist() == [[2, 3, 1], None, [1], [4, 2, 1]]
    assert out.column("text") == BATCH.column("text")  # (the text stays)
    again = derive.tokenized(out, "here")  # (an output column already there is replaced)
    assert again.schema.names == out.schema.names


def test_a_transform_runs_first_and_may_drop_rows_or_return_a_table() -> None:
    def kept(batch: pa.RecordBatch) -> pa.Table:
        return pa.Table.from_batches([batch.filter(batch.column("keep"))])

    derive = Derivation(tdu.Transform(kept, "kept"), tdu.Tokenize("text", TOK))
    assert derive.counts_rows and set(derive.identity) == {"tokenizer", "transform"}
    out = derive.tokenized(derive.transformed(BATCH, "here"), "here")
    assert out.column("id").to_pylist() == [0, 2, 3]
    assert out.column("tokens").to_pylist() == [[2, 3], [], [4, 2]]
    empty = derive.transformed(BATCH.slice(1, 1), "here")  # (every row dropped)
    assert empty.num_rows == 0 and derive.tokenized(empty, "here").num_rows == 0


def test_what_goes_wrong_names_where() -> None:
    def broken(batch: pa.RecordBatch) -> pa.RecordBatch:
        raise RuntimeError("no such field")

    with pytest.raises(tdu.DataError, match=r"^f.parquet \(chunk 0:1\): the transform 'b' raised"):
        Derivation(tdu.Transform(broken, "b")).transformed(BATCH, "f.parquet (chunk 0:1)")
    with pytest.raises(tdu.DataError, match=r"returned list, not a pyarrow\.RecordBatch"):
        Derivation(tdu.Transform(lambda b: [], "l")).transformed(BATCH, "f")
    with pytest.raises(tdu.DataError, match="'body' is not among the rows' columns"):
        Derivation(None, tdu.Tokenize("body", TOK)).tokenized(BATCH, "f")
    with pytest.raises(tdu.UnsupportedTypeError, match="'id' holds int64, not text"):
        Derivation(None, tdu.Tokenize("id", TOK)).tokenized(BATCH, "f")
    negative = tdu.Tokenize("text", lambda texts: [[-5] for _ in texts], fingerprint="n")
    with pytest.raises(tdu.DataError, match="token id outside int32"):
        Derivation(None, negative).tokenized(BATCH, "f")
    words = tdu.Tokenize("text", lambda texts: [["x"] for _ in texts], fingerprint="w")
    with pytest.raises(tdu.DataError, match="something other than token ids"):
        Derivation(None, words).tokenized(BATCH, "f")
