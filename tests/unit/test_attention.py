"""`torch_dataloader_utils.attention` and the positions of packed batches, by brute force
against transformers' own readers of ``position_ids``: with ``positions="fragment"`` the
boundaries read from positions alone are those of ``cu_seqlens``, in a ``[B, L]`` batch (sdpa,
eager: `find_packed_sequence_indices`) and flattened to ``[1, B * L]`` (FlashAttention:
`prepare_fa_kwargs_from_position_ids`); with ``"document"`` they are where
`positions_show_fragments` says, and not always."""

from __future__ import annotations

import itertools
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from transformers.masking_utils import find_packed_sequence_indices
from transformers.modeling_flash_attention_utils import prepare_fa_kwargs_from_position_ids

from torch_dataloader_utils.attention import (
    block_mask,
    document_mask,
    fragment_ids,
    hf_inputs,
    labels,
    positions_show_fragments,
    varlen_inputs,
)
from torch_dataloader_utils.batching import Packing
from torch_dataloader_utils.errors import InvalidArgumentError
from torch_dataloader_utils.stream.fragments import Fragments
from torch_dataloader_utils.stream.packing import PackedConverter


def _batches(
    lengths: list[int],
    seq_len: int,
    batch_size: int,
    method: str,
    positions: str,
    *,
    static_shape: bool = False,
    cuts: list[int] | None = None,
) -> list[dict[str, Any]]:
    """The documents of ``lengths`` (tokens numbered from 1) as a stream of packed batches, as
    a worker makes them; ``cuts``: the stream cut in blocks there and the blocks' fragments
    reversed (what a shuffle does: a document cut by a block goes on elsewhere)."""
    token, docs = 1, []
    for n in lengths:
        docs.append(list(range(token, token + n)))
        token += n
    fragments = Fragments.from_lists(pa.array(docs, pa.list_(pa.int64())), 0)
    if cuts:
        bounds = [0, *sorted(set(cuts)), fragments.num_rows]
        blocks = [fragments.slice(a, b - a) for a, b in itertools.pairwise(bounds) if b > a]
        fragments = Fragments.concat(
            [b.permuted(np.arange(len(b.begin))[::-1].copy()) for b in blocks]
        )
    budget = Packing("tokens", seq_len, method=method).batch_tokens(batch_size)
    convert = PackedConverter(
        seq_len,
        0,
        method=method,
        positions=positions,
        static_shape=static_shape,
        batch_size=batch_size,
        batch_tokens=budget,
    )
    return [convert(fragments.slice(at, budget)) for at in range(0, fragments.num_rows, budget)]


def _cut_starts(batch: dict[str, Any]) -> list[int]:
    return batch["cu_seqlens"][:-1].tolist()


def _hf_rows_starts(batch: dict[str, Any]) -> list[int]:
    """Where transformers' sdpa/eager detection starts a sequence in a ``[B, L]`` batch."""
    positions = batch["position_ids"].long()
    found = find_packed_sequence_indices(positions)
    if found is None:  # one sequence a row
        found = torch.zeros_like(positions)
    step = torch.ones_like(found, dtype=torch.bool)
    step[:, 1:] = found[:, 1:] != found[:, :-1]
    return step.view(-1).nonzero().view(-1).tolist()


def _flash_flat_starts(batch: dict[str, Any]) -> list[int]:
    """Where transformers' FlashAttention path starts a sequence in ``[1, B * L]``."""
    (cu, _), _ = prepare_fa_kwargs_from_position_ids(batch["position_ids"].reshape(1, -1))
    return cu[:-1].tolist()


documents = st.lists(st.integers(0, 40), min_size=1, max_size=30)


@settings(max_examples=150, deadline=None)
@given(
    lengths=documents,
    seq_len=st.integers(2, 16),
    batch_size=st.integers(1, 4),
    method=st.sampled_from(["concat", "best_fit"]),
    static_shape=st.booleans(),
    cuts=st.lists(st.integers(0, 300), max_size=4),
)
def test_fragment_positions_show_every_boundary_to_every_reader(
    lengths: list[int],
    seq_len: int,
    batch_size: int,
    method: str,
    static_shape: bool,
    cuts: list[int],
) -> None:
    if sum(lengths) == 0:
        return
    for batch in _batches(
        lengths, seq_len, batch_size, method, "fragment", static_shape=static_shape, cuts=cuts
    ):
        assert _hf_rows_starts(batch) == _cut_starts(batch)
        assert _flash_flat_starts(batch) == _cut_starts(batch)
        assert positions_show_fragments(batch)
        if static_shape:
            assert tuple(batch["input_ids"].shape) == (batch_size, seq_len)


@settings(max_examples=150, deadline=None)
@given(
    lengths=documents,
    seq_len=st.integers(2, 16),
    batch_size=st.integers(1, 4),
    method=st.sampled_from(["concat", "best_fit"]),
    cuts=st.lists(st.integers(0, 300), max_size=4),
)
def test_document_positions_show_the_boundaries_exactly_where_it_says(
    lengths: list[int], seq_len: int, batch_size: int, method: str, cuts: list[int]
) -> None:
    if sum(lengths) == 0:
        return
    for batch in _batches(lengths, seq_len, batch_size, method, "document", cuts=cuts):
        shown = _hf_rows_starts(batch) == _cut_starts(batch)
        assert positions_show_fragments(batch) == shown
        # hf_inputs then adds the mask that keeps the fragments apart
        assert ("attention_mask" in hf_inputs(batch, "sdpa")) == (not shown)


def test_document_positions_can_hide_a_boundary_and_fragment_ones_do_not() -> None:
    """The smallest case a user found: best fit put a continuation piece (positions 3, 4)
    right after a piece ending at position 2."""
    hidden = _batches([11, 5, 3], 8, 2, "best_fit", "document")
    assert hidden[-1]["input_ids"].tolist() == [[17, 18, 19, 15, 16, 0, 0, 0]]
    assert hidden[-1]["position_ids"].tolist() == [[0, 1, 2, 3, 4, 0, 1, 2]]
    assert not positions_show_fragments(hidden[-1])
    shown = _batches([11, 5, 3], 8, 2, "best_fit", "fragment")
    assert shown[-1]["position_ids"].tolist() == [[0, 1, 2, 0, 1, 0, 1, 2]]
    assert positions_show_fragments(shown[-1])


@pytest.mark.parametrize("method", ["concat", "best_fit"])
def test_static_shape_pads_the_last_batch_with_whole_sequences(method: str) -> None:
    loose = _batches([30, 7, 12], 8, 4, method, "fragment")
    static = _batches([30, 7, 12], 8, 4, method, "fragment", static_shape=True)
    assert loose[-1]["input_ids"].shape[0] < 4
    for batch, same in zip(static, loose, strict=True):
        assert tuple(batch["input_ids"].shape) == (4, 8)
        real = batch["document_ids"] >= 0
        # the same tokens; the added sequences are padding, each a fragment of its own
        assert (
            batch["input_ids"][real].tolist()
            == same["input_ids"][same["document_ids"] >= 0].tolist()
        )
        rows = same["input_ids"].shape[0]
        assert (batch["document_ids"][rows:] == -1).all()
        assert set(range(rows * 8, 32, 8)) <= set(batch["cu_seqlens"].tolist())
        assert batch["cu_seqlens"][-1] == 32


def _reference_fragments(batch: dict[str, Any]) -> torch.Tensor:
    flat = torch.zeros(batch["input_ids"].numel(), dtype=torch.int64)
    for i, (a, b) in enumerate(itertools.pairwise(batch["cu_seqlens"].tolist())):
        flat[a:b] = i
    return flat.view(batch["input_ids"].shape)


def test_labels_masks_and_varlen_keywords_follow_the_fragments() -> None:
    for batch in _batches([30, 7, 12, 1, 0, 5], 8, 3, "best_fit", "document", cuts=[9, 40]):
        fragments = fragment_ids(batch)
        assert torch.equal(fragments.long(), _reference_fragments(batch))
        target = labels(batch)
        starts = torch.zeros(target.numel(), dtype=torch.bool)
        starts[batch["cu_seqlens"][:-1].long()] = True
        pad = batch["document_ids"].view(-1) < 0
        ignored = starts | pad
        assert (target.view(-1)[ignored] == -100).all()
        assert torch.equal(target.view(-1)[~ignored], batch["input_ids"].view(-1)[~ignored])
        mask = document_mask(batch)
        rows, length = batch["input_ids"].shape
        for r, q, k in itertools.product(range(rows), range(length), range(length)):
            want = bool(fragments[r, q] == fragments[r, k]) and k <= q
            assert bool(mask[r, 0, q, k]) == want
        additive = document_mask(batch, dtype=torch.float32)
        assert torch.equal(additive == 0, mask)
        assert (additive[~mask] == torch.finfo(torch.float32).min).all()
        dense = block_mask(batch).to_dense()  # (blocks of 128: one block here)
        assert dense.shape[0] == rows
        kw = varlen_inputs(batch)
        assert kw["cu_seqlens_q"].dtype == torch.int32
        assert (
            kw["max_seqlen_q"]
            == batch["max_seqlen"]
            == max(b - a for a, b in itertools.pairwise(batch["cu_seqlens"].tolist()))
        )


def test_hf_inputs_by_attention_implementation() -> None:
    (batch,) = _batches([5, 3], 8, 1, "concat", "fragment")
    sdpa = hf_inputs(batch, "sdpa")
    assert sdpa["use_cache"] is False and "attention_mask" not in sdpa
    assert sdpa["position_ids"].dtype == sdpa["input_ids"].dtype == torch.int64
    flash = hf_inputs(batch, "flash_attention_2", with_labels=False)
    assert "labels" not in flash
    assert flash["cu_seq_lens_q"].tolist() == batch["cu_seqlens"].tolist()
    assert flash["max_length_q"] == batch["max_seqlen"]
    with pytest.raises(InvalidArgumentError, match="attn_implementation"):
        hf_inputs(batch, "flash_attention_9")
    with pytest.raises(InvalidArgumentError, match="dtype"):
        document_mask(batch, dtype=torch.int32)
