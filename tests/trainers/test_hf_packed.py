"""Packed batches in a real Hugging Face transformers model (a tiny Llama built from a config):
each fragment's logits in the packed batch equal the fragment run alone, for every attention
implementation's inputs (`tdu.attention`), concat and best fit, 0 and 2 workers, both kinds of
``position_ids``; the packed loss is the sum of the fragments' losses; and
``examples/train_hf_packed.py`` trains, checkpoints and resumes exactly."""

from __future__ import annotations

import itertools
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from transformers import AttentionInterface, LlamaConfig, LlamaForCausalLM
from transformers.masking_utils import AttentionMaskInterface, flash_attention_mask

import torch_dataloader_utils as tdu
from tests.packed_data import PAD, write_documents
from tests.trainers.conftest import run_example
from torch_dataloader_utils.attention import hf_inputs, positions_show_fragments

pytestmark = [pytest.mark.timeout(300)]


@pytest.fixture(autouse=True, scope="module")
def one_thread() -> Iterator[None]:
    """The models' steps on one thread (two test processes share two cores here)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


VOCAB = 2048  # above every token id of the data: ids are the tokens themselves
SEQ_LEN, BATCH = 16, 3
# float32 logits of a fragment packed and alone agree to ~3e-7 on this model
TOLERANCE = 1e-5


def _config(attn: str) -> LlamaConfig:
    return LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,  # fragment positions stay below SEQ_LEN
        attn_implementation=attn,
    )


def _models(*attns: str) -> dict[str, LlamaForCausalLM]:
    """One set of random weights under each attention implementation."""
    torch.manual_seed(0)
    first = LlamaForCausalLM(_config(attns[0])).eval()
    out = {attns[0]: first}
    for attn in attns[1:]:
        model = LlamaForCausalLM(_config(attn)).eval()
        model.load_state_dict(first.state_dict())
        out[attn] = model
    return out


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, int]:
    root = tmp_path_factory.mktemp("corpus")
    where = write_documents(root, files=3, per_file=25, seed=5, row_group_size=6)
    assert max(where) < VOCAB
    return root, len(where)


def _batches(root: Path, method: str, positions: str, workers: int) -> list[dict[str, Any]]:
    loader = tdu.create_dataloader(
        str(root),
        packing=tdu.Packing(
            "tokens", seq_len=SEQ_LEN, pad_value=PAD, method=method, positions=positions
        ),
        batch_size=BATCH,
        # In file order, the batches are fixed: two of best fit's have document positions that
        # hide a boundary (the case a mask must cover); the unit tests shuffle.
        shuffle=False,
        num_workers=workers,
        multiprocessing_context="fork" if workers else None,
    )
    return list(loader)


def _inputs(batch: dict[str, Any], attn: str) -> dict[str, Any]:
    """`hf_inputs`, the pads (-1 here, to tell them from tokens) made a token the model has."""
    inputs = hf_inputs(batch, attn)
    inputs["input_ids"] = inputs["input_ids"].clamp(min=0)
    return inputs


def _alone(model: LlamaForCausalLM, ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return model(input_ids=ids[None], position_ids=positions[None], use_cache=False).logits[0]


def _check_fragments(
    model: LlamaForCausalLM,
    batch: dict[str, Any],
    inputs: dict[str, Any],
    alone_in: LlamaForCausalLM | None = None,
) -> tuple[float, float]:
    """The largest difference between a fragment's logits packed and alone (run by
    ``alone_in``: the same weights, by default ``model``), and the packed batch's summed loss
    less the sum of the fragments' summed losses."""
    with torch.no_grad():
        logits = model(**{k: v for k, v in inputs.items() if k != "labels"}).logits
    flat = logits.view(-1, VOCAB)
    ids = inputs["input_ids"].view(-1)
    positions = inputs["position_ids"].view(-1)
    documents = batch["document_ids"].view(-1)
    cu = batch["cu_seqlens"].tolist()
    worst, alone_loss = 0.0, 0.0
    for a, b in itertools.pairwise(cu):
        if documents[a] < 0:  # padding
            continue
        alone = _alone(alone_in or model, ids[a:b], positions[a:b])
        worst = max(worst, float((alone - flat[a:b]).abs().max()))
        if b - a > 1:
            alone_loss += float(F.cross_entropy(alone[:-1], ids[a + 1 : b], reduction="sum"))
    # The packed loss: logits at t predict the label at t + 1, per row (as the model shifts).
    shifted = inputs["labels"][:, 1:].reshape(-1)
    packed_loss = float(
        F.cross_entropy(logits[:, :-1].reshape(-1, VOCAB), shifted, reduction="sum")
    )
    return worst, packed_loss - alone_loss


@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("positions", ["fragment", "document"])
@pytest.mark.parametrize("method", ["concat", "best_fit"])
def test_each_fragment_reads_as_if_alone_in_sdpa_and_eager(
    corpus: tuple[Path, int], method: str, positions: str, workers: int
) -> None:
    root, total = corpus
    batches = _batches(root, method, positions, workers)
    seen = Counter(t for b in batches for t in b["input_ids"][b["input_ids"] != PAD].tolist())
    assert seen == Counter(range(total))  # every token once
    if (method, positions) == ("best_fit", "document"):
        assert any(not positions_show_fragments(b) for b in batches)
    models = _models("sdpa", "eager")
    for attn, model in models.items():
        for batch in batches:
            inputs = _inputs(batch, attn)
            assert inputs["use_cache"] is False
            if positions == "fragment":  # the model finds the fragments from positions alone
                assert "attention_mask" not in inputs
            worst, loss_gap = _check_fragments(model, batch, inputs)
            assert worst < TOLERANCE, (attn, method, positions, batch["input_ids"])
            assert abs(loss_gap) < 1e-3, (attn, method, positions)


def test_the_issues_smallest_case_no_longer_merges_two_documents(tmp_path: Path) -> None:
    """Best fit once placed a continuation piece right after a piece ending one position
    before it: ``[300, 301, 302, 203, 204]`` at positions ``[0, 1, 2, 3, 4]``, read by
    transformers as one document."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    docs = [list(range(100, 111)), list(range(200, 205)), list(range(300, 303))]
    pq.write_table(pa.table({"tokens": pa.array(docs, pa.list_(pa.int64()))}), tmp_path / "a.pq")
    loader = tdu.create_dataloader(
        str(tmp_path / "a.pq"),
        packing=tdu.Packing("tokens", seq_len=8, method="best_fit"),
        batch_size=2,
    )
    (model,) = _models("sdpa").values()
    for batch in loader:
        worst, _ = _check_fragments(model, batch, hf_inputs(batch, "sdpa"))
        assert worst < TOLERANCE
    assert batch["input_ids"].tolist() == [[300, 301, 302, 203, 204, 0, 0, 0]]
    assert batch["position_ids"].tolist() == [[0, 1, 2, 0, 1, 0, 1, 2]]


def test_a_cache_turns_transformers_packed_detection_off(corpus: tuple[Path, int]) -> None:
    """Why `hf_inputs` passes ``use_cache=False``: with the config's default cache, documents
    attend across their boundaries (what docs/how-to/llm.md warns of)."""
    root, _ = corpus
    (model,) = _models("sdpa").values()
    batch = _batches(root, "concat", "fragment", 0)[0]
    inputs = _inputs(batch, "sdpa")
    assert _check_fragments(model, batch, inputs)[0] < TOLERANCE
    inputs["use_cache"] = True
    assert _check_fragments(model, batch, inputs)[0] > 1e-3


def _varlen_reference(
    module: Any,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    *args: Any,
    scaling: float | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """``flash_attn_varlen_func``'s meaning in plain PyTorch (no GPU here): causal attention
    within each ``cu_seq_lens_q`` span of the flattened tokens, given as transformers gives a
    FlashAttention implementation its keywords."""
    cu = kwargs["cu_seq_lens_q"]
    assert kwargs["cu_seq_lens_k"] is cu
    assert kwargs["max_length_q"] == int((cu[1:] - cu[:-1]).max())
    rows, heads, length, dim = query.shape
    groups = heads // key.shape[1]
    q = query.transpose(1, 2).reshape(rows * length, heads, dim)
    k = key.repeat_interleave(groups, 1).transpose(1, 2).reshape(rows * length, heads, dim)
    v = value.repeat_interleave(groups, 1).transpose(1, 2).reshape(rows * length, heads, dim)
    out = torch.empty_like(q)
    for a, b in zip(cu[:-1].tolist(), cu[1:].tolist(), strict=True):
        span = [t[a:b].transpose(0, 1) for t in (q, k, v)]
        out[a:b] = F.scaled_dot_product_attention(*span, is_causal=True, scale=scaling).transpose(
            0, 1
        )
    return out.view(rows, length, heads, dim), None


@pytest.mark.parametrize("method", ["concat", "best_fit"])
def test_flash_attentions_keywords_reach_the_attention_and_keep_documents_apart(
    corpus: tuple[Path, int], method: str
) -> None:
    """FlashAttention needs a GPU; its keywords (``cu_seq_lens_q/k``, ``max_length_q/k``) go
    through transformers' model call to a registered implementation with its meaning."""
    AttentionInterface.register("tdu_varlen_reference", _varlen_reference)
    AttentionMaskInterface.register("tdu_varlen_reference", flash_attention_mask)
    root, _ = corpus
    models = _models("tdu_varlen_reference", "eager")
    for positions in ("fragment", "document"):
        for batch in _batches(root, method, positions, 0):
            inputs = _inputs(batch, "flash_attention_2")
            assert "attention_mask" not in inputs and inputs["cu_seq_lens_q"].dtype == torch.int32
            with torch.no_grad():
                flash = models["tdu_varlen_reference"](
                    **{k: v for k, v in inputs.items() if k != "labels"}
                ).logits
            eager_inputs = _inputs(batch, "eager")
            worst, _ = _check_fragments(models["eager"], batch, eager_inputs)
            assert worst < TOLERANCE
            with torch.no_grad():
                eager = models["eager"](
                    **{k: v for k, v in eager_inputs.items() if k != "labels"}
                ).logits
            assert float((flash - eager).abs().max()) < TOLERANCE
            # The same keywords serve the batch flattened to [1, B * L].
            flat = {k: v for k, v in inputs.items() if k != "labels"}
            flat.update({k: inputs[k].reshape(1, -1) for k in ("input_ids", "position_ids")})
            with torch.no_grad():
                flat_logits = models["tdu_varlen_reference"](**flat).logits
            assert float((flat_logits.view_as(flash) - flash).abs().max()) < TOLERANCE


def test_flex_attention_takes_the_block_mask(corpus: tuple[Path, int]) -> None:
    root, _ = corpus
    models = _models("flex_attention", "eager")  # (alone: eager, a block mask a call is slow)
    for batch in _batches(root, "best_fit", "document", 0)[:3]:
        inputs = _inputs(batch, "flex_attention")
        worst, loss_gap = _check_fragments(models["flex_attention"], batch, inputs, models["eager"])
        assert worst < TOLERANCE and abs(loss_gap) < 1e-3


@pytest.mark.parametrize("method", ["concat", "best_fit"])
def test_static_shapes_never_recompile_a_compiled_step(
    corpus: tuple[Path, int], method: str
) -> None:
    """Every batch ``[batch_size, seq_len]``, the streams' short last ones padded (2 workers:
    two of them), so a step compiled for static shapes runs the whole epoch without
    recompiling; the tokens are read once and the padding is masked."""
    import torch._dynamo

    root, total = corpus
    ROWS = 6  # (a stream's last batch of this data fills fewer: concat and best fit)
    loader = tdu.create_dataloader(
        str(root),
        packing=tdu.Packing(
            "tokens", seq_len=SEQ_LEN, pad_value=PAD, method=method, static_shape=True
        ),
        batch_size=ROWS,
        shuffle=True,
        num_workers=2,
        multiprocessing_context="fork",
    )
    torch.manual_seed(0)
    table = torch.nn.Embedding(VOCAB, 8)

    @torch.compile(backend="eager", dynamic=False)
    def step(ids: torch.Tensor, positions: torch.Tensor, documents: torch.Tensor) -> torch.Tensor:
        real = (documents >= 0).unsqueeze(-1)
        return (table(ids.clamp(min=0)) * real).sum() + positions.sum()

    torch._dynamo.reset()
    seen: Counter[int] = Counter()
    with torch._dynamo.config.patch(error_on_recompile=True):
        for batch in loader:
            assert tuple(batch["input_ids"].shape) == (ROWS, SEQ_LEN)
            step(batch["input_ids"], batch["position_ids"], batch["document_ids"])
            ids = batch["input_ids"]
            seen.update(ids[batch["document_ids"] >= 0].tolist())
    assert seen == Counter(range(total))


def test_the_example_trains_checkpoints_and_resumes_exactly() -> None:
    output = run_example("train_hf_packed.py", timeout=280)
    assert "every token exactly once per epoch: yes" in output
    assert "the same weights as without stopping: yes" in output
    assert "batches [(4, 128)]" in output  # static shapes: the last batches padded too
