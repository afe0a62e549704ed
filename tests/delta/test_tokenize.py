"""A Delta table of raw text tokenized in the loader, at a pinned version: the census counts
each chunk's rows, every token of the version read once across ranks and workers, and a later
version (rows appended) is another plan; against the one-process oracle (`tests.text_data`)."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from deltalake import write_deltalake

import torch_dataloader_utils as tdu
from tests.packed_data import tokens_of
from tests.text_data import oracle, where_of, write_corpus

pytestmark = [
    pytest.mark.timeout(300),
    pytest.mark.filterwarnings("ignore:This DataLoader will create:UserWarning"),
]

SEQ_LEN, BATCH = 8, 3


@pytest.mark.parametrize(("world_size", "workers"), [(1, 0), (2, 2)])
def test_a_delta_versions_text_is_tokenized_every_token_once(
    tmp_path: Path, world_size: int, workers: int
) -> None:
    corpus = write_corpus(tmp_path / "corpus", files=2, per_file=40)
    parts = [pq.read_table(p) for p in sorted(corpus.root.glob("*.parquet"))]
    table = tmp_path / "text"
    write_deltalake(table, parts[0])  # version 0
    write_deltalake(table, parts[1], mode="append")  # version 1: the second file's rows
    first = set(parts[0]["id"].to_pylist())
    tokens = {i: t for i, t in oracle(corpus).items() if i in first}
    where = where_of(tokens)
    seen: Counter[int] = Counter()
    counts = []
    for rank in range(world_size):
        loader = tdu.create_dataloader(
            str(table),
            format="delta",
            version=0,
            tokenize=tdu.Tokenize("text", corpus.tokenizer),
            packing=tdu.Packing("tokens", SEQ_LEN, pad_value=-1),
            batch_size=BATCH,
            shuffle=True,
            null_policy="fill",
            remainder="pad",
            rank=rank,
            world_size=world_size,
            num_workers=workers,
            **({"multiprocessing_context": "fork", "timeout": 60} if workers else {}),
        )
        assert dict(loader.dataset.plan.details)["version"] == "0"
        n = 0
        for batch in loader:
            seen.update(tokens_of(batch, where, seq_len=SEQ_LEN, batch_size=BATCH))
            n += 1
        counts.append(n)
    assert len(set(counts)) == 1
    assert set(seen) == set(where)  # every token of version 0, none of version 1's rows
    assert sum(seen.values()) - len(where) < world_size * BATCH * SEQ_LEN  # (the pad's)
