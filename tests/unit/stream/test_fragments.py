"""`stream.fragments.Fragments`, by brute force over small documents: every token held once with
its document and position, sliced by tokens and joined again, moved by whole documents."""

from __future__ import annotations

import itertools
from collections import Counter

import numpy as np
import pyarrow as pa
from hypothesis import example, given, settings
from hypothesis import strategies as st

from tests.unit.stream.checks import triples
from torch_dataloader_utils.planning.shuffle import document_permutation
from torch_dataloader_utils.stream.fragments import MAX_BUFFERS, TOKENS_PER_COPY, Fragments

documents_st = st.lists(
    st.one_of(st.none(), st.lists(st.integers(0, 1000), max_size=9)), max_size=12
)


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
    # The parts' tokens are not copied: the joined fragments lie in the parts' own buffers
    # (a document cut between two of them runs from one into the next).
    assert all(np.shares_memory(b, whole.buffers[0]) for b in joined.buffers if len(b))
    assert len(joined.buffers) == max(1, sum(1 for p in parts if len(p)))
    order = document_permutation(len(whole.begin), seed=len(cuts), epoch=0, stream=0, block=0)
    shuffled = triples(whole.permuted(order))
    assert triples(joined.permuted(order)) == shuffled
    for a, b in itertools.pairwise(bounds):
        assert triples(joined.permuted(order).slice(a, b - a)) == shuffled[a:b]


@settings(max_examples=200, deadline=None)
@example(docs=[[0, 1, 2, 3, 4, 5, 6]], cuts=list(range(8)), seed=0, long=False)  # (9 buffers)
@given(
    docs=documents_st,
    cuts=st.lists(st.integers(0, 80), max_size=12),
    seed=st.integers(0, 9),
    long=st.booleans(),
)
def test_fragments_over_several_buffers_hold_the_same_tokens(
    docs: list[list[int] | None], cuts: list[int], seed: int, long: bool
) -> None:
    """The same fragments over one buffer and over it cut into several (at any token, more
    than `MAX_BUFFERS` copied into one): the same tokens, permuted and sliced; a block's
    tokens gathered fragment by fragment (``long``) or through an index."""
    if long:  # (documents long enough to be copied fragment by fragment)
        docs = [None if d is None else d * TOKENS_PER_COPY for d in docs]
    whole = Fragments.from_lists(pa.array(docs, pa.list_(pa.int64())), 0)
    values = whole.buffers[0]
    at = sorted({min(c, len(values)) for c in cuts})
    split = Fragments.of(
        tuple(np.split(values, at)), whole.begin, whole.end, whole.document, whole.position
    )
    assert len(split.buffers) == (len(at) + 1 if len(at) < MAX_BUFFERS else 1)
    order = document_permutation(len(whole.begin), seed=seed, epoch=0, stream=0, block=0)
    for a, b in ((whole, split), (whole.permuted(order), split.permuted(order))):
        for lo, hi in itertools.pairwise([0, *at, whole.num_rows]):
            assert triples(b.slice(lo, hi - lo)) == triples(a.slice(lo, hi - lo))
        if long:  # (a copy per fragment, not one gather)
            assert np.array_equal(b.tokens(np.empty(len(b), b.dtype)), a.tokens())
    parts = [split.slice(lo, hi - lo) for lo, hi in itertools.pairwise([0, *at, len(split)])]
    joined = Fragments.concat(parts)
    assert triples(joined) == triples(whole)
    assert len(joined.buffers) <= MAX_BUFFERS


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
