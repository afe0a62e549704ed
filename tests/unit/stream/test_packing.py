"""Packing's pure steps, by brute force over small documents: a document's tokens laid out as
rows, shuffled by whole documents, cut into sequences with their boundaries."""

from __future__ import annotations

import itertools
from collections import Counter

import numpy as np
import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st

from torch_dataloader_utils.planning.shuffle import document_permutation
from torch_dataloader_utils.stream.packing import explode, pack

documents_st = st.lists(
    st.one_of(st.none(), st.lists(st.integers(0, 1000), max_size=9)), max_size=12
)


@settings(max_examples=200, deadline=None)
@given(docs=documents_st, cut=st.integers(0, 12), first=st.integers(0, 5))
def test_every_token_becomes_one_row_with_its_document_and_position(
    docs: list[list[int] | None], cut: int, first: int
) -> None:
    array = pa.array(docs, pa.list_(pa.int32()))
    sliced = array.slice(min(cut, len(docs)))
    rows = explode(sliced, first)
    expected = [
        (token, first + d, p)
        for d, doc in enumerate(docs[min(cut, len(docs)) :])
        for p, token in enumerate(doc or [])
    ]
    got = list(
        zip(
            rows.column("input_ids").to_pylist(),
            rows.column("document").to_pylist(),
            rows.column("position").to_pylist(),
            strict=True,
        )
    )
    assert got == expected


@settings(max_examples=200, deadline=None)
@given(lengths=st.lists(st.integers(1, 6), max_size=10), seed=st.integers(0, 9))
def test_a_document_order_keeps_each_document_whole_and_in_order(
    lengths: list[int], seed: int
) -> None:
    documents = np.repeat(np.arange(len(lengths)), lengths)
    order = document_permutation(documents, seed=seed, epoch=0, stream=0, block=0)
    assert sorted(order.tolist()) == list(range(len(documents)))  # a permutation
    shuffled = documents[order]
    runs = [d for i, d in enumerate(shuffled.tolist()) if i == 0 or shuffled[i - 1] != d]
    assert Counter(runs) == Counter(range(len(lengths)))  # each document in one run
    for d in range(len(lengths)):
        rows = order[shuffled == d]
        assert rows.tolist() == sorted(rows.tolist())  # its tokens in order


@settings(max_examples=300, deadline=None)
@given(lengths=st.lists(st.integers(1, 7), max_size=10), seq_len=st.integers(1, 8))
def test_sequences_hold_every_token_once_with_boundaries_from_the_documents(
    lengths: list[int], seq_len: int
) -> None:
    documents = np.repeat(np.arange(len(lengths)) * 10, lengths)
    positions = np.concatenate([np.arange(n) for n in lengths]) if lengths else np.zeros(0, int)
    tokens = np.arange(len(documents)) + 100
    packed = pack(tokens, documents, positions, seq_len, pad_value=-7)
    n = len(tokens)
    flat = packed.input_ids.reshape(-1)
    assert flat[:n].tolist() == tokens.tolist()
    assert (flat[n:] == -7).all() and packed.padding == len(flat) - n < seq_len
    assert packed.position_ids.reshape(-1)[:n].tolist() == positions.tolist()
    cu = packed.cu_seqlens.tolist()
    assert cu[0] == 0 and cu[-1] == len(flat) and cu == sorted(set(cu))
    # A fragment never crosses a sequence start nor a document change.
    for a, b in itertools.pairwise(cu):
        assert a // seq_len == (b - 1) // seq_len or a >= n
        if a < n:
            assert len(set(documents[a:b].tolist())) == 1
    assert packed.max_seqlen == max((b - a for a, b in itertools.pairwise(cu)), default=0)
    ids = packed.document_ids.reshape(-1)
    assert (ids[n:] == -1).all()
    if n:
        assert ids[0] == 0 and (np.diff(ids[:n]) >= 0).all()


@settings(max_examples=150, deadline=None)
@given(docs=documents_st, first=st.integers(0, 5))
def test_an_eos_token_follows_every_document_that_is_not_null(
    docs: list[list[int] | None], first: int
) -> None:
    rows = explode(pa.array(docs, pa.list_(pa.int32())), first, eos=-5)
    expected = [
        (token, first + d, p)
        for d, doc in enumerate(docs)
        if doc is not None
        for p, token in enumerate([*doc, -5])
    ]
    got = list(
        zip(
            rows.column("input_ids").to_pylist(),
            rows.column("document").to_pylist(),
            rows.column("position").to_pylist(),
            strict=True,
        )
    )
    assert got == expected
