"""An Iceberg table of raw text tokenized in the loader: the census counts the live rows of
each chunk (position deletes applied), every token of them read once across ranks and workers,
with a transform too; against the one-process oracle (`tests.text_data`)."""

from __future__ import annotations

from collections import Counter
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import torch_dataloader_utils as tdu
from tests.iceberg.conftest import NAMESPACE, Catalog, commit_position_deletes, data_files
from tests.packed_data import tokens_of
from tests.text_data import Corpus, oracle, titled, where_of, write_corpus

pytestmark = [
    pytest.mark.timeout(300),
    pytest.mark.filterwarnings("ignore:This DataLoader will create:UserWarning"),
]

SEQ_LEN, BATCH = 8, 3
DELETED = range(5, 15)  # positions deleted in the first data file


def _table(catalog: Catalog) -> tuple[Corpus, set[int]]:
    """``db.text``: the corpus's files appended (one data file each, row groups of 7), rows
    ``DELETED`` of the first data file deleted by a position-delete file; returns the corpus
    and the ids of the rows the table holds."""
    corpus = write_corpus(catalog.root / "corpus", files=2, per_file=40)
    parts = [pq.read_table(p) for p in sorted(corpus.root.glob("*.parquet"))]
    schema = pa.schema([f.with_nullable(True) for f in parts[0].schema])
    table = catalog.catalog.create_table(
        f"{NAMESPACE}.text", schema=schema, properties={"write.parquet.row-group-limit": "7"}
    )
    for part in parts:
        table.append(part.cast(schema))
    first = min(data_files(table), key=lambda f: f.file_path)
    ids = pq.read_table(first.file_path.removeprefix("file://"))["id"].to_pylist()
    commit_position_deletes(table, {first.file_path: list(DELETED)})
    return corpus, set(corpus.texts) - {ids[p] for p in DELETED}


@pytest.mark.parametrize(("world_size", "workers", "transform"), [(1, 0, False), (2, 2, True)])
def test_a_tables_live_rows_are_tokenized_every_token_once(
    catalog: Catalog, world_size: int, workers: int, transform: bool
) -> None:
    corpus, live = _table(catalog)
    tokens = {i: t for i, t in oracle(corpus, transform=transform).items() if i in live}
    where = where_of(tokens)
    options: dict[str, Any] = {}
    if transform:
        options["transform"] = tdu.Transform(titled, fingerprint="titled-v1")
    if workers:
        options.update(multiprocessing_context="fork", timeout=60)
    seen: Counter[int] = Counter()
    counts = []
    for rank in range(world_size):
        loader, _ = tdu.IcebergDataset.create_dataloader(
            table=f"{NAMESPACE}.text",
            catalog_config=catalog.config,
            tokenize=tdu.Tokenize("text", corpus.tokenizer),
            packing=tdu.Packing("tokens", SEQ_LEN, pad_value=-1),
            batch_size=BATCH,
            shuffle=True,
            null_policy="fill",
            remainder="pad",
            rank=rank,
            world_size=world_size,
            num_workers=workers,
            **options,
        )
        n = 0
        for batch in loader:
            seen.update(tokens_of(batch, where, seq_len=SEQ_LEN, batch_size=BATCH))
            n += 1
        counts.append(n)
    assert len(set(counts)) == 1
    assert set(seen) == set(where)  # every live token (the deleted rows' none)
    assert sum(seen.values()) - len(where) < world_size * BATCH * SEQ_LEN
