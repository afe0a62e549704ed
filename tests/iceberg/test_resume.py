"""Exact resume of an Iceberg read (the library's resume harness), and the pinned snapshot in
the state: a commit that lands between save and resume is not read into the resumed epoch."""

from __future__ import annotations

import pickle
from collections import Counter
from itertools import islice

import pyarrow.compute as pc
import pytest

from tests.iceberg.conftest import (
    Catalog,
    batch_ids,
    commit_position_deletes,
    data_files,
    flat,
    loader,
    rows,
)
from torch_dataloader_utils import StateMismatchError
from torch_dataloader_utils.testing import check_elastic_resume, check_resume

pytestmark = [
    pytest.mark.timeout(180),
    pytest.mark.filterwarnings("ignore:This DataLoader will create:UserWarning"),
]

PARTS = [range(0, 700), range(700, 900), range(900, 1000)]
BATCH = 50


@pytest.fixture
def table(catalog: Catalog) -> str:
    """db.res: three files, and deletes in the first one (positions 0-9 and 650-699)."""
    created = catalog.create("res", PARTS)
    first = next(f for f in data_files(created) if f.record_count == 700)
    commit_position_deletes(created, {first.file_path: [*range(10), *range(650, 700)]})
    return "res"


LIVE = [i for i in range(1000) if not (i < 10 or 650 <= i < 700)]


def test_exact_resume_with_workers_shuffle_and_deletes(catalog: Catalog, table: str) -> None:
    check_resume(
        lambda: loader(catalog, table, batch_size=BATCH, shuffle=True, num_workers=2)[0],
        expected_ids=LIVE,
        positions=[0, 3, 9, 17],
    )


def test_exact_resume_with_a_filter(catalog: Catalog, table: str) -> None:
    check_resume(
        lambda: loader(catalog, table, batch_size=BATCH, shuffle=True, filters=pc.field("x") > 100)[
            0
        ],
        expected_ids=[i for i in LIVE if i / 2 > 100],
        positions=[0, 5, 15],
    )


def test_elastic_resume(catalog: Catalog, table: str) -> None:
    check_elastic_resume(
        lambda rank, world, workers: loader(
            catalog,
            table,
            batch_size=BATCH,
            shuffle=True,
            rank=rank,
            world_size=world,
            num_workers=workers,
        )[0],
        old=(2, 2),
        new=(3, 1),
        batches=4,
    )


def test_a_commit_between_save_and_resume(catalog: Catalog, table: str) -> None:
    first, dataset = loader(catalog, table, batch_size=BATCH, shuffle=True, num_workers=2)
    pinned = dataset.snapshot_id
    reference = batch_ids(first)  # an uninterrupted epoch
    assert Counter(flat(reference)) == Counter(LIVE)
    interrupted, _ = loader(catalog, table, batch_size=BATCH, shuffle=True, num_workers=2)
    done = list(islice(iter(interrupted), 7))
    assert len(done) == 7
    state = pickle.loads(pickle.dumps(interrupted.state_dict()))
    assert state["plan"]["snapshot_id"] == str(pinned)

    catalog.load(table).append(rows(range(5000, 5100)))  # a commit lands meanwhile

    resumed, _ = loader(catalog, table, batch_size=BATCH, shuffle=True, num_workers=2)
    with pytest.raises(StateMismatchError, match=f"pass snapshot_id={pinned}"):
        resumed.load_state_dict(state)
    resumed, again = loader(
        catalog, table, batch_size=BATCH, shuffle=True, num_workers=2, snapshot_id=pinned
    )
    assert again.snapshot_id == pinned
    resumed.load_state_dict(state)
    assert batch_ids(resumed) == reference[7:]  # exactly the rest, none of the new rows
