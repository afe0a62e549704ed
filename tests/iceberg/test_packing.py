"""Packed sequences from an Iceberg table read by name, and from a mixture of a table and a
Parquet folder: planning counts each chunk's tokens in the live rows that pass the filter
(position deletes and row filters applied), so every token is read once, ranks get equal
batches, and a state resumes the token order. Token ids are unique in the data. Token-budget
batches of a table likewise plan every live row's length."""

from __future__ import annotations

import itertools
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.compute as pc
import pytest

import torch_dataloader_utils as tdu
from tests.iceberg.conftest import NAMESPACE, Catalog, commit_position_deletes, data_files
from tests.packed_data import Where, documents, token_table, tokens_of, write_documents

pytestmark = [
    pytest.mark.timeout(180),
    pytest.mark.filterwarnings("ignore:This DataLoader will create:UserWarning"),
]

SEQ_LEN, BATCH = 8, 3
PARTS = (120, 90, 60)  # documents per data file (one append each)


def _table(catalog: Catalog, name: str = "docs") -> Where:
    """``db.<name>``: PARTS documents of 0-29 tokens (`token_table` rows: ``id``, ``label``,
    ``tokens``), row groups of 25 rows; returns each token's document and position."""
    rng = np.random.default_rng(5)
    where: Where = {}
    parts = []
    for count in PARTS:
        first = sum(len(p) for p in parts)
        docs = documents(rng, count, where, first, nulls=True)
        parts.append(token_table(docs, first_id=first))
    table = catalog.catalog.create_table(
        f"{NAMESPACE}.{name}",
        schema=parts[0].schema,
        properties={"write.parquet.row-group-limit": "25"},
    )
    for part in parts:
        table.append(part)
    return where


def _packed(catalog: Catalog, name: str = "docs", **options: Any) -> tdu.TabularDataLoader:
    eos = options.pop("eos", None)
    workers = options.setdefault("num_workers", 0)
    if workers:
        options.setdefault("multiprocessing_context", "fork")
        options.setdefault("timeout", 60)
    loader, _ = tdu.IcebergDataset.create_dataloader(
        table=f"{NAMESPACE}.{name}",
        catalog_config=catalog.config,
        packing=tdu.Packing("tokens", seq_len=SEQ_LEN, pad_value=-1, eos_token=eos),
        batch_size=BATCH,
        shuffle=True,
        null_policy="fill",
        **options,
    )
    return loader


def _tokens(batch: dict[str, Any], where: Where) -> list[int]:
    return tokens_of(batch, where, seq_len=SEQ_LEN, batch_size=BATCH)


@pytest.mark.parametrize("workers", [0, 2])
def test_a_packed_table_reads_every_token_once_with_equal_batches_on_two_ranks(
    catalog: Catalog, workers: int
) -> None:
    where = _table(catalog)
    for epoch in (0, 1):
        seen: Counter[int] = Counter()
        batches = []
        for rank in range(2):
            loader = _packed(catalog, num_workers=workers, rank=rank, world_size=2)
            loader.set_epoch(epoch)
            got = [_tokens(b, where) for b in loader]
            assert len(got) == len(loader)
            batches.append(len(got))
            seen.update(t for b in got for t in b)
        assert batches[0] == batches[1] > 0  # equal batches on every rank
        assert max(seen.values()) == 1
        assert len(where) - len(seen) == len(where) % 2  # "drop": the remainder of 2 ranks


def test_one_rank_reads_the_whole_table_and_counts_match_the_plan(catalog: Catalog) -> None:
    where = _table(catalog)
    loader = _packed(catalog, num_workers=2)
    seen = Counter(t for b in loader for t in _tokens(b, where))
    assert seen == Counter(set(where))
    assert loader.dataset.plan.num_rows == len(where)  # the plan's rows are tokens
    assert len(loader) == -(-len(where) // (SEQ_LEN * BATCH))


def test_deletes_and_a_filter_count_only_the_live_rows_that_pass(catalog: Catalog) -> None:
    where = _table(catalog)
    table = catalog.load("docs")
    first = next(f for f in data_files(table) if f.record_count == PARTS[0])
    deleted = [*range(0, 10), *range(60, 75)]  # rows of the first file (ids = positions)
    commit_position_deletes(table, {first.file_path: deleted})
    kept = {
        d
        for d in range(sum(PARTS))
        if d not in deleted and d % 7 < 3  # documents are numbered as ids
    }
    expected = {t for t, (d, _) in where.items() if d in kept}
    for filters in ("label < 3", pc.field("label") < 3):
        loader = _packed(catalog, num_workers=2, filters=filters)
        seen = Counter(t for b in loader for t in _tokens(b, where))
        assert seen == Counter(expected)
        assert loader.dataset.plan.num_rows == len(expected)


def test_an_eos_token_after_every_document_is_counted_at_planning(catalog: Catalog) -> None:
    where = _table(catalog)
    loader = _packed(catalog, num_workers=2, eos=-9, columns=["tokens"])
    read: Counter[int] = Counter()
    for batch in loader:
        ids = batch["input_ids"]
        read.update(ids[ids != -1].tolist())
    eos = read.pop(-9)
    assert read == Counter(set(where))
    table = catalog.load("docs").scan().to_arrow()
    assert eos == len(table) - table["tokens"].null_count  # one per document not null
    assert loader.dataset.plan.num_rows == len(where) + eos


def test_columns_a_packed_table_cannot_carry_are_refused(catalog: Catalog) -> None:
    _table(catalog)
    with pytest.raises(tdu.InvalidArgumentError, match="'id'"):
        _packed(catalog, num_workers=0, columns=["tokens", "id"])


def test_a_resumed_packed_table_reads_every_remaining_token_once(catalog: Catalog) -> None:
    where = _table(catalog)
    seen: Counter[int] = Counter()
    first = _packed(catalog, num_workers=2, remainder="pad")
    first.set_epoch(1)
    for batch in itertools.islice(first, 5):
        seen.update(_tokens(batch, where))
    state = first.state_dict()
    exact = _packed(catalog, num_workers=2, remainder="pad")
    exact.load_state_dict(state)
    rest = [t for b in exact for t in _tokens(b, where)]
    assert Counter(rest) + seen == Counter(set(where))
    for rank in range(2):  # elastic: the same state on two ranks of one worker each
        elastic = _packed(catalog, num_workers=1, rank=rank, world_size=2, remainder="pad")
        elastic.load_state_dict(state)
        seen.update(t for b in elastic for t in _tokens(b, where))
    assert set(seen) == set(where)
    # "pad" wraps to the start: only a few tokens twice, fewer than a batch per rank
    assert sum(seen.values()) - len(where) < 2 * BATCH * SEQ_LEN


def test_create_dataloader_packs_a_table_given_as_a_source(catalog: Catalog) -> None:
    """``tdu.create_dataloader(tdu.Source(table=...), packing=...)``: the table planned by the
    mixture's path, counted as IcebergDataset counts it."""
    where = _table(catalog)
    loader = tdu.create_dataloader(
        tdu.Source(table=f"{NAMESPACE}.docs", catalog_config=catalog.config),
        packing=tdu.Packing("tokens", seq_len=SEQ_LEN, pad_value=-1),
        batch_size=BATCH,
        shuffle=True,
        null_policy="fill",
        num_workers=0,
    )
    seen = Counter(t for b in loader for t in _tokens(b, where))
    # A mixture's quota of a source is its tokens in whole sequences: the rest opens its next
    # epoch.
    assert list(loader.dataset.quotas) == [len(where) // SEQ_LEN * SEQ_LEN]
    assert max(seen.values()) == 1 and set(seen) <= set(where)
    assert sum(seen.values()) == loader.dataset.quotas[0]


@pytest.mark.parametrize("workers", [0, 2])
def test_token_budget_batches_of_a_table_read_every_live_row_once(
    catalog: Catalog, workers: int
) -> None:
    """``batching=tdu.TokenBudget(...)`` plans the length of every live row that passes the
    filter, as for files: every such row once, each batch within its budget, equal ranks."""
    where = _table(catalog)
    table = catalog.load("docs")
    first = next(f for f in data_files(table) if f.record_count == PARTS[0])
    commit_position_deletes(table, {first.file_path: list(range(20, 40))})
    lengths = Counter(d for d, _ in where.values())
    expected = {d for d in range(sum(PARTS)) if not 20 <= d < 40 and d % 7 != 0}
    seen: Counter[int] = Counter()
    batches = []
    for rank in range(2):
        loader, _ = tdu.IcebergDataset.create_dataloader(
            table=f"{NAMESPACE}.docs",
            catalog_config=catalog.config,
            batching=tdu.TokenBudget("tokens", max_tokens=90),
            filters="label != 0",
            shuffle=True,
            null_policy="fill",
            num_workers=workers,
            multiprocessing_context="fork" if workers else None,
            rank=rank,
            world_size=2,
        )
        got = []
        for batch in loader:
            ids = batch["id"].tolist()
            rows, width = batch["tokens"].shape
            assert rows == len(ids) and rows * width <= 90
            assert batch["tokens_lengths"].tolist() == [lengths[i] for i in ids]
            got.append(ids)
        assert len(got) == len(loader)
        batches.append(len(got))
        seen.update(i for ids in got for i in ids)
    assert batches[0] == batches[1]
    assert max(seen.values()) == 1 and set(seen) <= expected
    assert len(expected) - len(seen) == len(expected) % 2  # "drop": the remainder of 2 ranks


def test_a_column_that_is_not_token_lists_is_refused_naming_the_table(catalog: Catalog) -> None:
    _table(catalog)
    with pytest.raises(tdu.UnsupportedTypeError, match=r"db\.docs.*'label' holds int64"):
        tdu.IcebergDataset(
            "db.docs", catalog_config=catalog.config, packing=tdu.Packing("label", seq_len=8)
        )
    with pytest.raises(tdu.ColumnNotFoundError, match=r"db\.docs.*'text'"):
        tdu.IcebergDataset(
            "db.docs", catalog_config=catalog.config, packing=tdu.Packing("text", seq_len=8)
        )


@pytest.mark.parametrize(("world_size", "workers"), [(1, 0), (2, 2)])
def test_a_packed_mixture_of_a_table_and_a_parquet_folder(
    catalog: Catalog, tmp_path: Path, world_size: int, workers: int
) -> None:
    where = _table(catalog)
    folder = tmp_path / "parquet"
    table_tokens = len(where)  # the folder's tokens come after the table's
    write_documents(folder, 2, 60, seed=9, where=where, first_document=sum(PARTS))
    sources = [
        tdu.Source(table=f"{NAMESPACE}.docs", catalog_config=catalog.config, columns=["tokens"]),
        tdu.Source(str(folder), columns=["tokens"]),
    ]
    for epoch in (0, 1):
        seen: Counter[int] = Counter()
        batches = []
        for rank in range(world_size):
            loader = tdu.create_dataloader(
                sources,
                packing=tdu.Packing("tokens", seq_len=SEQ_LEN, pad_value=-1),
                batch_size=BATCH,
                shuffle=True,
                null_policy="fill",
                source_column="source",
                num_workers=workers,
                multiprocessing_context="fork" if workers else None,
                rank=rank,
                world_size=world_size,
            )
            loader.set_epoch(epoch)
            quotas = loader.dataset.quotas
            got = []
            for batch in loader:
                tokens = _tokens(batch, where)
                flat = batch["input_ids"].reshape(-1)
                sources_of = batch["source"].reshape(-1)[flat >= 0].tolist()
                assert sources_of == [int(t >= table_tokens) for t in tokens]
                got.append(tokens)
            assert len(got) == len(loader)
            batches.append(len(got))
            seen.update(t for b in got for t in b)
        assert len(set(batches)) == 1
        # Each source's quota is its tokens in whole sequences; "drop" leaves out less than
        # a batch per rank; a source's next pass may meet its last tokens again in epoch 1.
        assert list(quotas) == [
            n // SEQ_LEN * SEQ_LEN for n in (table_tokens, len(where) - table_tokens)
        ]
        twice = sum(c - 1 for c in seen.values())
        assert twice == 0 if epoch == 0 else twice < 2 * SEQ_LEN
        per_source = Counter(int(t >= table_tokens) for t in seen)
        short = world_size * BATCH * SEQ_LEN
        for i in (0, 1):
            assert quotas[i] - short < per_source[i] <= quotas[i]
