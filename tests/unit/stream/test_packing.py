"""`stream.packing.pack`, by brute force over small documents: the tokens cut into sequences in
order, with their boundaries and positions (best fit: test_best_fit.py)."""

from __future__ import annotations

import itertools

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.unit.stream.checks import check_positions, triples
from torch_dataloader_utils.stream import pack_kernel
from torch_dataloader_utils.stream.fragments import Fragments
from torch_dataloader_utils.stream.packing import pack


@pytest.mark.parametrize("compiled", [True, False])
@settings(max_examples=300, deadline=None)
@given(
    docs=st.lists(st.lists(st.integers(0, 1000), min_size=1, max_size=7), max_size=10),
    seq_len=st.integers(1, 8),
    skip=st.integers(0, 9),
    dtype=st.sampled_from([pa.int32(), pa.int64(), pa.uint16()]),
    positions=st.sampled_from(["fragment", "document"]),
)
def test_sequences_hold_every_token_once_with_boundaries_from_the_documents(
    compiled: bool,
    docs: list[list[int]],
    seq_len: int,
    skip: int,
    dtype: pa.DataType,
    positions: str,
) -> None:
    """With the compiled kernel (`stream.pack_kernel`) and with numpy alone."""
    fragments = Fragments.from_lists(pa.array(docs, pa.list_(dtype)), 0).slice(skip)
    every = triples(fragments)
    assert pack_kernel.load()
    kernel = pack_kernel._state.kernel
    pack_kernel._state.kernel = kernel if compiled else None
    try:
        packed = pack(fragments, seq_len, pad_value=-7, positions=positions)
    finally:
        pack_kernel._state.kernel = kernel
    n = len(every)
    flat = packed.input_ids.reshape(-1)
    assert flat[:n].tolist() == [t for t, _, _ in every]
    assert (flat[n:] == -7).all() and packed.padding == len(flat) - n < seq_len
    assert packed.input_ids.dtype in (np.int32, np.int64)  # (uint16 widened)
    check_positions(packed, [p for _, _, p in every], positions)
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
