"""The snippets of docs/how-to/llm.md's "What each attention implementation needs", run as a
user would paste them after building a packed ``loader``: the transformers training loop, and
each attention of your own, whose output must be per-fragment causal attention.

FlashAttention needs a GPU, which CI lacks: where ``flash_attn`` does not import, the snippet
runs against `flash_attn_varlen_func_reference`, a plain-PyTorch function with the same
signature and meaning (flash-attn 2's documented one)."""

from __future__ import annotations

import itertools
import re
import sys
import types
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
import torch.nn.functional as F

import torch_dataloader_utils as tdu

pytestmark = [pytest.mark.timeout(300)]

DOC = Path(__file__).resolve().parents[2] / "docs" / "how-to" / "llm.md"
SECTION = "## What each attention implementation needs"


def snippets() -> list[str]:
    text = DOC.read_text()
    section = text[text.index(SECTION) :]
    section = section[: section.index("\n## ", len(SECTION))]
    return re.findall(r"```python\n(.*?)```", section, flags=re.S)


def flash_attn_varlen_func_reference(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    cu_seqlens_k: torch.Tensor,
    max_seqlen_q: int,
    max_seqlen_k: int,
    dropout_p: float = 0.0,
    softmax_scale: float | None = None,
    causal: bool = False,
) -> torch.Tensor:
    assert cu_seqlens_q.dtype == torch.int32 and torch.equal(cu_seqlens_q, cu_seqlens_k)
    assert isinstance(max_seqlen_q, int) and max_seqlen_q == max_seqlen_k
    assert max_seqlen_q == int((cu_seqlens_q[1:] - cu_seqlens_q[:-1]).max())
    out = torch.empty_like(q)
    for a, b in itertools.pairwise(cu_seqlens_q.tolist()):
        span = [t[a:b].transpose(0, 1) for t in (q, k, v)]
        out[a:b] = F.scaled_dot_product_attention(
            *span, is_causal=causal, scale=softmax_scale
        ).transpose(0, 1)
    return out


def _imports(name: str) -> bool:
    try:
        __import__(name)
    except ImportError:
        return False
    return True


def per_fragment(batch: dict[str, Any], q: torch.Tensor, k: torch.Tensor, v: torch.Tensor):
    """Causal attention within each ``cu_seqlens`` fragment, ``[B, heads, L, dim]``."""
    rows, heads, length, dim = q.shape

    def flat(x: torch.Tensor) -> torch.Tensor:
        return x.transpose(1, 2).reshape(rows * length, heads, dim)

    cu = batch["cu_seqlens"].to(torch.int32)
    longest = int(batch["max_seqlen"])
    out = flash_attn_varlen_func_reference(
        flat(q), flat(k), flat(v), cu, cu, longest, longest, causal=True
    )
    return out.view(rows, length, heads, dim).transpose(1, 2)


def test_the_attention_snippets_run_and_keep_documents_apart(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    docs = [list(range(1000 * d, 1000 * d + n)) for d, n in enumerate([70, 9, 33, 120, 5, 41])]
    pq.write_table(pa.table({"tokens": pa.array(docs, pa.list_(pa.int64()))}), tmp_path / "a.pq")
    loader = tdu.create_dataloader(
        str(tmp_path / "a.pq"),
        packing=tdu.Packing("tokens", seq_len=64, method="best_fit"),
        batch_size=2,
    )
    torch.manual_seed(0)
    training, setup, *own = snippets()
    assert len(own) == 3  # FlashAttention's, FlexAttention's and SDPA's
    namespace: dict[str, Any] = {"loader": loader}
    exec(training, namespace)  # a few steps of the training loop, every batch
    assert torch.isfinite(namespace["loss"])
    exec(setup, namespace)
    batch, q, k, v = (namespace[name] for name in ("batch", "q", "k", "v"))
    want = per_fragment(batch, q, k, v)
    for snippet in own:
        namespace.pop("out", None)
        with monkeypatch.context() as patch:
            if "flash_attn" in snippet and not _imports("flash_attn"):
                # (only for this snippet: transformers would take it for the real package)
                fake = types.ModuleType("flash_attn")
                fake.flash_attn_varlen_func = flash_attn_varlen_func_reference  # type: ignore[attr-defined]
                patch.setitem(sys.modules, "flash_attn", fake)
            exec(snippet, namespace)
        out = namespace["out"]
        if out.shape != want.shape:  # (FlashAttention's: flattened tokens)
            out = out.view(q.shape[0], q.shape[2], q.shape[1], q.shape[3]).transpose(1, 2)
        assert float((out - want).abs().max()) < 1e-5, snippet
