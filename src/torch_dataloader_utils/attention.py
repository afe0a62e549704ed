"""What each attention implementation takes, from a packed batch (docs/how-to/llm.md).

A packed batch (`batching.Packing`) says where its fragments (a document's tokens within one
sequence, or a sequence's padding) start in three ways: ``cu_seqlens``, ``document_ids`` and,
with the default ``positions="fragment"``, ``position_ids`` (each fragment counts from 0). Each
attention implementation reads another of them (docs/adr/0026-positions-and-attention-inputs.md):

- Hugging Face transformers with ``sdpa`` or ``eager`` finds the fragments from
  ``position_ids`` (a new one wherever a position does not go up by one), but only without an
  ``attention_mask`` and without a cache (``use_cache=False``): `hf_inputs`.
- FlashAttention reads ``cu_seqlens`` (`varlen_inputs` for ``flash_attn_varlen_func``;
  `hf_inputs` passes them to a transformers model as ``cu_seq_lens_q/k`` and
  ``max_length_q/k``, for any batch shape).
- FlexAttention takes a block mask (`block_mask`); SDPA or eager attention of your own, a 4-D
  mask (`document_mask`).

`labels` gives the targets of a causal LM loss that never predicts across a fragment boundary.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from .errors import InvalidArgumentError

__all__ = [
    "block_mask",
    "document_mask",
    "fragment_ids",
    "hf_inputs",
    "labels",
    "positions_show_fragments",
    "varlen_inputs",
]

# transformers' FlashAttention implementations (`attn_implementation`): they take the fragments
# as `cu_seq_lens_q/k`; the others read `position_ids` or a mask.
_FLASH = ("flash_attention_2", "flash_attention_3", "flash_attention_4")
_MASKED = ("sdpa", "eager")


def fragment_ids(batch: Mapping[str, Any]) -> torch.Tensor:
    """Each token's fragment, numbered from 0 in the batch (``cu_seqlens`` spread over the
    tokens), int32 ``[batch_size, seq_len]``: tokens attend only to their own fragment."""
    ids = batch["input_ids"]
    cu = batch["cu_seqlens"].to(ids.device, torch.int64)
    starts = torch.zeros(ids.numel(), dtype=torch.int32, device=ids.device)
    starts[cu[1:-1]] = 1
    return starts.cumsum(0, dtype=torch.int32).view(ids.shape)


def labels(batch: Mapping[str, Any], *, ignore_index: int = -100) -> torch.Tensor:
    """The targets of a causal LM loss (int64, ``[batch_size, seq_len]``): ``input_ids``, with
    ``ignore_index`` at each fragment's first token and on padding, so no token is predicted
    from another document's. The loss shifts them (as transformers' models do): the logits at
    ``t`` predict the label at ``t + 1``."""
    ids: torch.Tensor = batch["input_ids"]
    out = ids.to(torch.int64, copy=True).view(-1)
    out[batch["cu_seqlens"].to(ids.device, torch.int64)[:-1]] = ignore_index
    out[batch["document_ids"].to(ids.device).view(-1) < 0] = ignore_index
    return out.view(ids.shape)


def positions_show_fragments(batch: Mapping[str, Any]) -> bool:
    """Whether ``position_ids`` alone show the fragments as transformers reads them (a new one
    in each row wherever a position does not go up by one): always with
    ``positions="fragment"``; with ``"document"``, not where a piece's positions go on from
    the piece before it."""
    positions = batch["position_ids"]
    step = torch.ones_like(positions, dtype=torch.bool)
    step[:, 1:] = positions[:, 1:] - positions[:, :-1] != 1
    starts = torch.zeros(positions.numel(), dtype=torch.bool, device=positions.device)
    starts[batch["cu_seqlens"].to(positions.device, torch.int64)[:-1]] = True
    return bool(torch.equal(step.view(-1), starts))  # (every sequence start is a cut)


def varlen_inputs(batch: Mapping[str, Any]) -> dict[str, Any]:
    """The keywords of FlashAttention's ``flash_attn_varlen_func`` (q, k and v flattened to
    ``[batch_size * seq_len, heads, dim]``): ``cu_seqlens_q/k`` (int32) and
    ``max_seqlen_q/k`` (int)."""
    cu = batch["cu_seqlens"].to(torch.int32)
    longest = int(batch["max_seqlen"])
    return {
        "cu_seqlens_q": cu,
        "cu_seqlens_k": cu,
        "max_seqlen_q": longest,
        "max_seqlen_k": longest,
    }


def document_mask(batch: Mapping[str, Any], *, dtype: torch.dtype = torch.bool) -> torch.Tensor:
    """A 4-D attention mask ``[batch_size, 1, seq_len, seq_len]``: each token sees the tokens
    of its fragment up to itself. ``torch.bool`` (default; True: attend) for SDPA; a floating
    dtype gives the additive form (0 or the dtype's lowest value) eager attention adds to its
    scores. It holds ``batch_size * seq_len**2`` values: for long sequences prefer
    `block_mask` or `varlen_inputs`."""
    fragments = fragment_ids(batch)
    length = fragments.shape[1]
    causal = torch.ones(length, length, dtype=torch.bool, device=fragments.device).tril()
    same = fragments[:, :, None] == fragments[:, None, :]
    mask = (same & causal)[:, None]
    if dtype == torch.bool:
        return mask
    if not dtype.is_floating_point:
        raise InvalidArgumentError(f"document_mask's dtype must be torch.bool or floating, {dtype}")
    out = torch.zeros(mask.shape, dtype=dtype, device=mask.device)
    return out.masked_fill_(~mask, torch.finfo(dtype).min)


def block_mask(batch: Mapping[str, Any], *, device: str | torch.device | None = None) -> Any:
    """FlexAttention's ``BlockMask`` of the batch: each token sees the tokens of its fragment up
    to itself (``flex_attention(q, k, v, block_mask=...)``, or a transformers model's
    ``attention_mask`` with ``attn_implementation="flex_attention"``)."""
    from torch.nn.attention.flex_attention import create_block_mask

    fragments = fragment_ids(batch)
    if device is not None:
        fragments = fragments.to(device)
    rows, length = fragments.shape

    def same_fragment_causal(b: Any, h: Any, q: Any, kv: Any) -> Any:
        return (fragments[b, q] == fragments[b, kv]) & (q >= kv)

    return create_block_mask(
        same_fragment_causal, rows, None, length, length, device=str(fragments.device)
    )


def hf_inputs(
    batch: Mapping[str, Any],
    attn_implementation: str = "sdpa",
    *,
    with_labels: bool = True,
    dtype: torch.dtype = torch.float32,
) -> dict[str, Any]:
    """The keywords of a transformers model's call for a packed batch, by the model's
    ``attn_implementation``: ``model(**hf_inputs(batch, "sdpa"))``.

    Always ``input_ids``, ``position_ids`` (int64), ``use_cache=False`` (a cache turns
    transformers' packed-sequence detection off) and, with ``with_labels``, `labels`.
    FlashAttention (``flash_attention_2/3/4``) gets ``cu_seq_lens_q/k`` and ``max_length_q/k``;
    ``flex_attention`` a `block_mask`; ``sdpa`` and ``eager`` read ``position_ids``, and get a
    `document_mask` (of ``dtype`` for eager) only where those do not show the fragments
    (``positions="document"``).

    Raises:
        InvalidArgumentError: an ``attn_implementation`` this does not know.
    """
    out: dict[str, Any] = {
        "input_ids": batch["input_ids"].to(torch.int64),
        "position_ids": batch["position_ids"].to(torch.int64),
        "use_cache": False,
    }
    if with_labels:
        out["labels"] = labels(batch)
    if attn_implementation in _FLASH:  # (varlen_inputs' values, under transformers' names)
        varlen = varlen_inputs(batch)
        out.update(
            cu_seq_lens_q=varlen["cu_seqlens_q"],
            cu_seq_lens_k=varlen["cu_seqlens_k"],
            max_length_q=varlen["max_seqlen_q"],
            max_length_k=varlen["max_seqlen_k"],
        )
    elif attn_implementation == "flex_attention":
        out["attention_mask"] = block_mask(batch)
    elif attn_implementation in _MASKED:
        if not positions_show_fragments(batch):
            mask_dtype = torch.bool if attn_implementation == "sdpa" else dtype
            out["attention_mask"] = document_mask(batch, dtype=mask_dtype)
    else:
        known = (*_MASKED, *_FLASH, "flex_attention")
        raise InvalidArgumentError(
            f"hf_inputs knows the attn_implementation values {known}, got "
            f"{attn_implementation!r}: for another, pass varlen_inputs(batch) or "
            "document_mask(batch) as it takes them"
        )
    return out
