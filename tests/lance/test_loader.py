"""A Lance dataset through the loader (`create_dataloader(path, format="lance")`): exact and
elastic resume, the version pinned at planning (a write after it is not read, a state saved at
one version refused at another with what to pass), `rows_at` naming the fragment and row, a
mixture with a Parquet folder, and packing a token-list column. Every test checks the multiset
of ids against what pylance reads of the version."""

from __future__ import annotations

import pickle
from collections import Counter
from itertools import islice
from pathlib import Path
from typing import Any

import lance
import numpy as np
import pyarrow as pa
import pytest

import torch_dataloader_utils as tdu
from tests.conftest import write_parquet
from tests.lance.data import append, live_ids, oracle, write_dataset
from tests.packed_data import Where, documents, token_table, tokens_of
from torch_dataloader_utils import StateMismatchError
from torch_dataloader_utils.testing import check_elastic_resume, check_resume

pytestmark = [
    pytest.mark.timeout(240),
    pytest.mark.filterwarnings("ignore:This DataLoader will create:UserWarning"),
    pytest.mark.filterwarnings("ignore:lance is not fork-safe:UserWarning"),
]

BATCH = 16


@pytest.fixture(scope="module")
def uri(tmp_path_factory: pytest.TempPathFactory) -> str:
    """Versions 1-4 (`tests.lance.data`); no test changes it."""
    return write_dataset(tmp_path_factory.mktemp("lance-loader") / "l.lance")


def loader(path: str, **options: Any) -> tdu.TabularDataLoader:
    options = {"batch_size": BATCH, "shuffle": True, "format": "lance", "num_workers": 0, **options}
    if options["num_workers"]:
        options.setdefault("multiprocessing_context", "fork")
        options.setdefault("timeout", 60)
    return tdu.create_dataloader(path, **options)


def ids_of(batches: Any) -> list[int]:
    return [i for batch in batches for i in batch["id"].tolist()]


def test_exact_resume_with_shuffle_and_deletes(uri: str) -> None:
    # (Pieces cut inside chunks of several units; workers: the elastic test and test_workers.)
    check_resume(
        lambda: loader(uri, split_rows=40),
        expected_ids=live_ids(4),
        positions=[0, 5, 11],
    )


def test_elastic_resume(uri: str) -> None:
    check_elastic_resume(
        lambda rank, world, workers: loader(
            uri, rank=rank, world_size=world, num_workers=workers, version=3
        ),
        old=(2, 2),
        new=(3, 0),
        batches=4,
    )


def test_the_version_is_pinned_at_planning(tmp_path: Path) -> None:
    path = write_dataset(tmp_path / "p.lance", versions=2)
    for workers, version in ((0, 2), (2, 4)):
        pinned = loader(path, num_workers=workers)
        expected = sorted(oracle(path, version)["id"].to_pylist())
        # After planning: rows appended and deleted (the deletes change the fragments' live
        # rows at the latest version, which a worker opening it would read instead).
        append(path, range(7000 + version, 7100))
        lance.dataset(path).delete(f"id % {version + 1} = 0")
        assert sorted(ids_of(pinned)) == expected
        pinned.set_epoch(1)
        assert sorted(ids_of(pinned)) == expected
    latest = loader(path)
    assert sorted(ids_of(latest)) == sorted(oracle(path)["id"].to_pylist())


def test_a_state_of_another_version_is_refused_naming_the_version(tmp_path: Path) -> None:
    path = write_dataset(tmp_path / "s.lance", versions=1)
    first = loader(path)
    reference = [b["id"].tolist() for b in first]
    saved = loader(path)
    _ = list(islice(iter(saved), 5))
    state = pickle.loads(pickle.dumps(saved.state_dict()))
    append(path, range(5000, 5050))  # version 2

    with pytest.raises(StateMismatchError, match="pass version=1"):
        loader(path).load_state_dict(state)
    resumed = loader(path, version=1)
    resumed.load_state_dict(state)
    assert [b["id"].tolist() for b in resumed] == reference[5:]  # the rest, none of v2's rows


def test_rows_at_names_the_fragment_and_its_live_row(uri: str) -> None:
    read = loader(uri, version=3, split_rows=25)
    batches = [b["id"].tolist() for b in read]
    dataset = lance.dataset(uri, version=3)
    fragment_of = {
        f"{uri}/data/{f.data_files()[0].path}": f.fragment_id for f in dataset.get_fragments()
    }
    for k in (0, 5, len(batches) - 1):
        rows = read.rows_at(k, columns=["id"]).to_pylist()
        assert [r["id"] for r in rows] == batches[k]
        for row in rows:
            fragment = dataset.get_fragment(fragment_of[row["__file__"]])
            # __row__ counts the fragment's live rows (its deleted rows left out).
            found = fragment.to_table(columns=["id"], offset=row["__row__"], limit=1)
            assert found["id"].to_pylist() == [row["id"]]


def test_a_mixture_with_a_parquet_folder(uri: str, tmp_path: Path) -> None:
    folder = tmp_path / "pq"
    for i, first in enumerate((10_000, 10_150)):
        write_parquet(folder / f"part-{i}.parquet", np.arange(first, first + 150))
    parquet_ids = list(range(10_000, 10_300))
    sources = [
        tdu.Source(uri, format="lance", columns=["id", "x"]),
        tdu.Source(str(folder), columns=["id", "x"]),
    ]
    got = ids_of(loader(sources, format="parquet", num_workers=2))
    assert Counter(got) == Counter([*live_ids(4), *parquet_ids])  # every row of both once

    weighted = [
        tdu.Source(uri, format="lance", version=2, weight=2, columns=["id", "x"]),
        tdu.Source(str(folder), weight=1, columns=["id", "x"]),
    ]
    mixed = loader(weighted, format="parquet", num_workers=2, epoch_rows=300)
    got = ids_of(mixed)
    lance_rows = [i for i in got if i < 10_000]
    assert len(lance_rows) == 200 and len(got) == 300
    assert len(set(lance_rows)) == 200 and set(lance_rows) <= set(live_ids(2))
    assert len(set(got) - set(lance_rows)) == 100 and set(got) - set(lance_rows) <= set(parquet_ids)


@pytest.fixture(scope="module")
def documents_uri(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, Where]:
    """Documents of unique tokens (list<int32>) in fragments of 60 rows, every fifth deleted;
    returns the dataset and each live token's document and position."""
    rng = np.random.default_rng(3)
    where: Where = {}
    table = token_table(documents(rng, 300, where, 0, nulls=True))
    table = table.set_column(2, "tokens", table["tokens"].cast(pa.list_(pa.int32())))
    path = str(tmp_path_factory.mktemp("lance-docs") / "docs.lance")
    lance.write_dataset(table, path, max_rows_per_file=60)
    lance.dataset(path).delete("id % 5 = 0")
    live = {t: (d, p) for t, (d, p) in where.items() if d % 5}
    return path, live


@pytest.mark.parametrize("workers", [0, 2])
def test_packing_reads_every_live_token_once_with_equal_batches(
    documents_uri: tuple[str, Where], workers: int
) -> None:
    path, where = documents_uri
    seq_len, batch = 8, 3
    seen: Counter[int] = Counter()
    counts = []
    for rank in range(2):
        packed = loader(
            path,
            batch_size=batch,
            packing=tdu.Packing("tokens", seq_len=seq_len, pad_value=-1),
            null_policy="fill",
            num_workers=workers,
            rank=rank,
            world_size=2,
        )
        got = [tokens_of(b, where, seq_len=seq_len, batch_size=batch) for b in packed]
        assert len(got) == len(packed)
        counts.append(len(got))
        seen.update(t for b in got for t in b)
    assert counts[0] == counts[1] > 0
    assert max(seen.values()) == 1 and set(seen) <= set(where)
    assert len(where) - len(seen) == len(where) % 2  # "drop": the remainder of 2 ranks
