"""Packing's pure steps, by brute force over small documents: documents held as fragments,
sliced by tokens, shuffled by whole documents, cut into sequences with their boundaries."""

from __future__ import annotations

import itertools
from collections import Counter

import numpy as np
import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st

from torch_dataloader_utils.planning.shuffle import document_permutation
from torch_dataloader_utils.stream.fragments import Fragments
from torch_dataloader_utils.stream.packing import pack

documents_st = st.lists(
    st.one_of(st.none(), st.lists(st.integers(0, 1000), max_size=9)), max_size=12
)


def triples(fragments: Fragments) -> list[tuple[int, int, int]]:
    """Each token of ``fragments`` in order, with its document and position."""
    out = []
    for b, e, d, p in zip(
        fragments.begin, fragments.end, fragments.document, fragments.position, strict=True
    ):
        out += [(int(fragments.values[b + i]), int(d), int(p + i)) for i in range(e - b)]
    assert [t for t, _, _ in out] == fragments.tokens().tolist()
    assert len(out) == fragments.num_rows
    return out


def expected(docs: list[list[int] | None], first: int, eos: int | None = None) -> list:
    return [
        (token, first + d, p)
        for d, doc in enumerate(docs)
        if doc is not None
        for p, token in enumerate([*doc, *([] if eos is None else [eos])])
    ]


@settings(max_examples=200, deadline=None)
@given(docs=documents_st, cut=st.integers(0, 12), first=st.integers(0, 5))
def test_every_token_is_held_once_with_its_document_and_position(
    docs: list[list[int] | None], cut: int, first: int
) -> None:
    array = pa.array(docs, pa.list_(pa.int32()))
    at = min(cut, len(docs))
    assert triples(Fragments.from_lists(array.slice(at), first)) == expected(docs[at:], first)


@settings(max_examples=150, deadline=None)
@given(docs=documents_st, first=st.integers(0, 5))
def test_an_eos_token_follows_every_document_that_is_not_null(
    docs: list[list[int] | None], first: int
) -> None:
    fragments = Fragments.from_lists(pa.array(docs, pa.list_(pa.int32())), first, eos=-5)
    assert triples(fragments) == expected(docs, first, eos=-5)


@settings(max_examples=300, deadline=None)
@given(docs=documents_st, cuts=st.lists(st.integers(0, 80), max_size=4))
def test_slices_cut_documents_and_concat_joins_them_again(
    docs: list[list[int] | None], cuts: list[int]
) -> None:
    whole = Fragments.from_lists(pa.array(docs, pa.list_(pa.int64())), 0)
    every = triples(whole)
    bounds = sorted({0, whole.num_rows, *(min(c, whole.num_rows) for c in cuts)})
    parts = [whole.slice(a, b - a) for a, b in itertools.pairwise(bounds)]
    for (a, b), part in zip(itertools.pairwise(bounds), parts, strict=True):
        assert triples(part) == every[a:b]
    joined = Fragments.concat(parts) if parts else whole
    assert triples(joined) == every
    # A document cut and joined again is one fragment.
    assert len(joined.begin) == len(whole.begin)


@settings(max_examples=200, deadline=None)
@given(lengths=st.lists(st.integers(1, 6), max_size=10), seed=st.integers(0, 9))
def test_a_document_order_moves_each_document_whole_and_in_order(
    lengths: list[int], seed: int
) -> None:
    docs = [list(range(100 * d, 100 * d + n)) for d, n in enumerate(lengths)]
    block = Fragments.from_lists(pa.array(docs, pa.list_(pa.int64())), 0)
    order = document_permutation(len(block.begin), seed=seed, epoch=0, stream=0, block=0)
    shuffled = triples(block.permuted(order))
    assert Counter(shuffled) == Counter(triples(block))
    runs = [d for i, (_, d, _) in enumerate(shuffled) if i == 0 or shuffled[i - 1][1] != d]
    assert sorted(runs) == list(range(len(lengths)))  # each document in one run, in order
    assert triples(block.permuted(order).in_values_order()) == triples(block)


@settings(max_examples=300, deadline=None)
@given(
    docs=st.lists(st.lists(st.integers(0, 1000), min_size=1, max_size=7), max_size=10),
    seq_len=st.integers(1, 8),
    skip=st.integers(0, 9),
    dtype=st.sampled_from([pa.int32(), pa.int64(), pa.uint16()]),
)
def test_sequences_hold_every_token_once_with_boundaries_from_the_documents(
    docs: list[list[int]], seq_len: int, skip: int, dtype: pa.DataType
) -> None:
    fragments = Fragments.from_lists(pa.array(docs, pa.list_(dtype)), 0).slice(skip)
    every = triples(fragments)
    packed = pack(fragments, seq_len, pad_value=-7)
    n = len(every)
    flat = packed.input_ids.reshape(-1)
    assert flat[:n].tolist() == [t for t, _, _ in every]
    assert (flat[n:] == -7).all() and packed.padding == len(flat) - n < seq_len
    assert packed.input_ids.dtype in (np.int32, np.int64)  # (uint16 widened)
    assert packed.position_ids.reshape(-1)[:n].tolist() == [p for _, _, p in every]
    cu = packed.cu_seqlens.tolist()
    assert cu[0] == 0 and cu[-1] == len(flat) and cu == sorted(set(cu))
    documents = [d for _, d, _ in every]
    # A fragment never crosses a sequence start nor a document change, and each is one.
    for a, b in itertools.pairwise(cu):
        assert a // seq_len == (b - 1) // seq_len or a >= n
        if a < n:
            assert len(set(documents[a:b])) == 1
            assert a % seq_len == 0 or documents[a - 1] != documents[a]
    assert packed.max_seqlen == max((b - a for a, b in itertools.pairwise(cu)), default=0)
    ids = packed.document_ids.reshape(-1)
    assert (ids[n:] == -1).all()
    if n:
        assert ids[0] == 0 and (np.diff(ids[:n]) >= 0).all()
        assert len(set(ids[:n].tolist())) == len(set(documents))
