"""Calling a tokenizer on a batch's texts: `tokenizers` directly (a transformers tokenizer
through its backend), else the callable.

`tokenizers` parallelises a batch on its own thread pool unless ``TOKENIZERS_PARALLELISM`` says
false; after a fork that pool deadlocks or warns. The loader runs its own parallelism (the
census's threads, DataLoader workers), so it turns the pool off unless the user set the variable:
one batch per thread, the GIL released, measured 1.34 M tokens/s on one thread and 2.40 on two
(docs/adr/0030-tokenizing-in-the-loader.md).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from typing import Any

from torch.utils.data import get_worker_info

__all__ = ["Encoder", "encoder_of", "own_parallelism"]

# Token ids of each text (a null text: None).
Encoder = Callable[[Sequence[str | None]], list[Any]]


def own_parallelism() -> None:
    """Turn `tokenizers`' own thread pool off unless the user chose: before any fork, so that
    a DataLoader worker forked after the tokenizer was used (trained, say) does not warn. In a
    DataLoader worker it is off whatever the user chose: a pool used before the fork deadlocks
    there, and the workers are the parallelism (a pool each would oversubscribe the cores)."""
    if get_worker_info() is not None:
        os.environ["TOKENIZERS_PARALLELISM"] = "false"
    else:
        os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def encoder_of(tokenizer: Any, *, add_special_tokens: bool) -> Encoder:
    """A function from texts to their token ids (lists of ints; ``None`` for a null text)."""
    own_parallelism()
    backend = getattr(tokenizer, "backend_tokenizer", None)
    fast = backend if backend is not None else tokenizer
    batch = getattr(fast, "encode_batch_fast", None) or getattr(fast, "encode_batch", None)
    if batch is not None and hasattr(fast, "to_str"):

        def encode(texts: Sequence[str | None]) -> list[Any]:
            given = [t for t in texts if t is not None]
            ids = iter(e.ids for e in batch(given, add_special_tokens=add_special_tokens))
            return [None if t is None else next(ids) for t in texts]

        return encode
    call: Callable[..., Any] = tokenizer
    transformers_like = hasattr(tokenizer, "convert_tokens_to_ids")

    def encode_callable(texts: Sequence[str | None]) -> list[Any]:
        given = [t for t in texts if t is not None]
        if transformers_like:
            out = call(given, add_special_tokens=add_special_tokens)["input_ids"]
        else:
            out = call(given)
        ids = iter(out)
        return [None if t is None else next(ids) for t in texts]

    return encode_callable
