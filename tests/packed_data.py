"""Documents of token lists for the packed-sequence tests, and the check of a packed batch.

Every token id is unique in the data (documents hold consecutive ids), so the multiset of the
token ids read says which tokens were read and how often, and a token's id tells its document
and position (`Where`). Pads are negative. Test modules import these from here, never from
each other.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

PAD = -1
Where = dict[int, tuple[int, int]]  # token -> (document, position in it)


def documents(
    rng: np.random.Generator,
    count: int,
    where: Where,
    first_document: int,
    *,
    longest: int = 30,
    nulls: bool = False,
) -> list[list[int] | None]:
    """``count`` documents of 0 to ``longest - 1`` tokens (with ``nulls``, some empty ones
    null), numbered from ``first_document``, their token ids following those already in
    ``where``, which learns each new token's document and position."""
    token = max(where, default=-1) + 1
    document = first_document
    out: list[list[int] | None] = []
    for _ in range(count):
        n = int(rng.integers(0, longest))
        if n == 0 and nulls and rng.random() < 0.5:
            out.append(None)
        else:
            out.append(list(range(token, token + n)))
            where.update({token + p: (document, p) for p in range(n)})
            token += n
        document += 1
    return out


def token_table(docs: list[list[int] | None], first_id: int = 0) -> pa.Table:
    """``docs`` as a table: ``id`` (the document's row number from ``first_id``), ``label``
    (``id % 7``) and ``tokens`` (lists of int64)."""
    ids = np.arange(first_id, first_id + len(docs), dtype=np.int64)
    return pa.table(
        {
            "id": pa.array(ids),
            "label": pa.array(ids % 7),
            "tokens": pa.array(docs, pa.list_(pa.int64())),
        }
    )


def write_documents(
    root: Path,
    files: int,
    per_file: int,
    *,
    seed: int = 7,
    row_group_size: int = 7,
    where: Where | None = None,
    first_document: int = 0,
) -> Where:
    """``files`` Parquet files of ``per_file`` documents each (`token_table`) under ``root``,
    their tokens numbered after those of ``where`` (which learns them), their documents (and
    ``id``) from ``first_document``; returns each token's document and position."""
    root.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    where = {} if where is None else where
    first = first_document
    for f in range(files):
        table = token_table(documents(rng, per_file, where, first), first_id=first)
        first += per_file
        pq.write_table(table, root / f"part-{f}.parquet", row_group_size=row_group_size)
    return where


def real_tokens(batch: dict[str, Any]) -> list[int]:
    """The tokens of a packed batch, pads left out."""
    ids = batch["input_ids"]
    return [int(t) for t in ids[ids >= 0].tolist()]


def tokens_of(
    batch: dict[str, Any],
    where: Where,
    *,
    seq_len: int,
    batch_size: int,
    positions: str = "fragment",
) -> list[int]:
    """The batch's tokens, after checking its shape, positions and boundaries: every
    ``cu_seqlens`` fragment inside one sequence and one document, in order; ``position_ids``
    counting from 0 in every fragment, padding included (``positions="document"``: each real
    token at its position in its document); ``max_seqlen`` the longest fragment."""
    ids = batch["input_ids"]
    assert ids.shape[1] == seq_len and ids.shape[0] <= batch_size
    flat = ids.reshape(-1)
    real = flat >= 0
    position_ids = batch["position_ids"].reshape(-1)
    cu = batch["cu_seqlens"].tolist()
    assert cu[0] == 0 and cu[-1] == flat.numel() and cu == sorted(set(cu))
    assert batch["max_seqlen"] == max(b - a for a, b in itertools.pairwise(cu))
    for a, b in itertools.pairwise(cu):
        assert a // seq_len == (b - 1) // seq_len  # never across a sequence
        fragment = flat[a:b][real[a:b]].tolist()
        if positions == "fragment" or not fragment:
            assert position_ids[a:b].tolist() == list(range(b - a))
        if fragment:
            docs = {where[t][0] for t in fragment}
            assert len(docs) == 1  # one document's tokens, in order
            if positions == "document":
                assert [where[t][1] for t in fragment] == position_ids[a:b][real[a:b]].tolist()
            assert fragment == list(range(fragment[0], fragment[0] + len(fragment)))
    return [int(t) for t in flat[real].tolist()]


def flat_tokens(batches: Iterable[list[int]]) -> list[int]:
    return [t for batch in batches for t in batch]


def tokens_in(root: Path, column: str = "tokens") -> int:
    """Tokens of the Parquet files under ``root`` (an example's data, whose ids are 0 to
    this less one)."""
    lists = pq.read_table(root, columns=[column])[column]
    return int(pc.sum(pc.list_value_length(lists)).as_py() or 0)
