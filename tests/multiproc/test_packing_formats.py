"""Packing reads every format that holds a list column: the same documents written as
Parquet, ORC, Arrow IPC (file and stream) and JSON Lines, packed over 2 ranks and 2 workers,
every token once with equal batches; and token-budget batches of the same."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.feather as feather
import pyarrow.ipc as ipc
import pyarrow.orc as orc
import pyarrow.parquet as pq
import pytest

import torch_dataloader_utils as tdu
from tests.packed_data import PAD, Where, documents, token_table, tokens_of

pytestmark = [
    pytest.mark.timeout(300),
    pytest.mark.filterwarnings("ignore:This DataLoader will create:UserWarning"),
]

SEQ_LEN, BATCH = 8, 2


def write(root: Path, fmt: str, table: pa.Table, part: int) -> None:
    """``table`` as one file of ``fmt`` under ``root``."""
    if fmt == "parquet":
        pq.write_table(table, root / f"part-{part}.parquet", row_group_size=9)
    elif fmt == "orc":
        orc.write_table(table, root / f"part-{part}.orc", stripe_size=4096)
    elif fmt == "arrow":
        feather.write_feather(table, root / f"part-{part}.arrow", chunksize=9)
    elif fmt == "arrows":
        with ipc.new_stream(root / f"part-{part}.arrows", table.schema) as out:
            for batch in table.to_batches(max_chunksize=9):
                out.write_batch(batch)
    else:
        with open(root / f"part-{part}.jsonl", "w") as out:
            for row in table.to_pylist():
                out.write(json.dumps(row) + "\n")


FORMATS = {"parquet": "parquet", "orc": "orc", "arrow": "ipc", "arrows": "ipc", "jsonl": "json"}


@pytest.fixture(scope="module", params=list(FORMATS))
def data(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Any:
    fmt = request.param
    root = tmp_path_factory.mktemp(fmt)
    rng = np.random.default_rng(5)
    where: Where = {}
    lengths: dict[int, int] = {}
    for part in range(3):
        docs = documents(rng, 30, where, part * 30, nulls=False)
        table = token_table(docs, first_id=part * 30)
        lengths.update({part * 30 + i: len(d or []) for i, d in enumerate(docs)})
        write(root, fmt, table, part)
    return root, FORMATS[fmt], where, lengths


def test_every_token_once_packed_over_ranks_and_workers(data: Any) -> None:
    root, fmt, where, _ = data
    seen: Counter[int] = Counter()
    counts = []
    for rank in range(2):
        loader = tdu.create_dataloader(
            str(root),
            format=fmt,
            packing=tdu.Packing("tokens", seq_len=SEQ_LEN, pad_value=PAD),
            batch_size=BATCH,
            shuffle=True,
            rank=rank,
            world_size=2,
            num_workers=2,
        )
        got = [tokens_of(b, where, seq_len=SEQ_LEN, batch_size=BATCH) for b in loader]
        counts.append(len(got))
        assert len(got) == len(loader)
        seen.update(t for ids in got for t in ids)
    assert counts[0] == counts[1] and max(seen.values()) == 1
    assert len(where) - len(seen) < 2  # "drop": fewer than a token per rank


def test_token_budget_batches_hold_every_row_once(data: Any) -> None:
    root, fmt, _, lengths = data
    loader = tdu.create_dataloader(
        str(root),
        format=fmt,
        batching=tdu.TokenBudget("tokens", max_tokens=64),
        shuffle=True,
        num_workers=2,
    )
    seen: Counter[int] = Counter()
    for batch in loader:
        rows, width = batch["tokens"].shape
        assert rows * width <= 64
        ids = batch["id"].tolist()
        assert batch["tokens_lengths"].tolist() == [lengths[i] for i in ids]
        seen.update(ids)
    assert seen == Counter(set(lengths))
