"""Delta tables through ``tdu.create_dataloader(path, format="delta")`` with real DataLoader
workers: every live row once over ranks x workers (fork and spawn) with equal batches, exact and
elastic resume, a mixture with a Parquet folder, packing a token-list column, ``rows_at``
naming the data file and row, a state saved at one version refused at another, the node cache.
The table has deletion vectors (inline and on disk) and column mapping by name."""

from __future__ import annotations

import pickle
from collections import Counter
from itertools import islice
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import torch_dataloader_utils as tdu
from tests.conftest import QuickBatches
from tests.delta.tables import DV_PARTS, HandTable, make_rows, write_dv_table
from torch_dataloader_utils import StateMismatchError
from torch_dataloader_utils.testing import check_elastic_resume, check_resume

pytest.importorskip("deltalake")
pytestmark = [
    pytest.mark.timeout(240),
    pytest.mark.filterwarnings("ignore:This DataLoader will create:UserWarning"),
]
BATCH = 16


@pytest.fixture(scope="module")
def table(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[int]]:
    """A hand-written table (deletion vectors, column mapping by name) and its live ids."""
    root = tmp_path_factory.mktemp("delta") / "dv"
    return root, write_dv_table(root, mode="name").live()


def _loader(root: Path, **options: Any) -> tdu.TabularDataLoader[Any]:
    if options.get("num_workers"):
        options.setdefault("multiprocessing_context", "fork")
        options.setdefault("timeout", 60)
    options.setdefault("batch_size", BATCH)
    return tdu.create_dataloader(str(root), format="delta", shuffle=True, **options)


def _ids(batches: list[dict[str, Any]]) -> list[int]:
    return [int(i) for b in batches for i in b["id"]]


@pytest.mark.parametrize("context", ["fork", "spawn"])
def test_every_live_row_once_over_ranks_and_workers(
    table: tuple[Path, list[int]], context: str
) -> None:
    root, live = table
    per_rank = []
    for rank in range(2):
        loader = _loader(
            root, num_workers=2, multiprocessing_context=context, rank=rank, world_size=2
        )
        loader.set_epoch(1)
        per_rank.append(list(loader))
    assert len(per_rank[0]) == len(per_rank[1])  # equal batches: DDP never hangs
    ids = [_ids(b) for b in per_rank]
    union = Counter(ids[0] + ids[1])
    assert max(union.values()) == 1 and set(union) <= set(live)
    assert len(union) >= len(live) - 1  # remainder "drop": fewer than world_size left out
    for batch in per_rank[0][:3]:  # values under their logical names, with their ids
        got = np.asarray(batch["id"])
        assert np.array_equal(np.asarray(batch["label"]), got % 7)
        assert np.allclose(np.asarray(batch["score"]), got * 0.5)


def test_exact_and_elastic_resume(table: tuple[Path, list[int]]) -> None:
    root, live = table
    check_resume(
        lambda: _loader(root, num_workers=2, batch_size=32), expected_ids=live, positions=[0, 5]
    )
    check_elastic_resume(
        lambda rank, world, workers: _loader(
            root, rank=rank, world_size=world, num_workers=workers
        ),
        old=(2, 2),
        new=(3, 1),
        batches=3,
    )


def test_a_mixture_with_a_parquet_folder(table: tuple[Path, list[int]], tmp_path: Path) -> None:
    root, live = table
    folder = tmp_path / "parquet"
    folder.mkdir()
    pq.write_table(pa.table(make_rows(range(10_000, 10_100))), folder / "a.parquet")
    loader = tdu.create_dataloader(
        [
            tdu.Source(str(root), format="delta", columns=["id", "label"]),
            tdu.Source(str(folder), columns=["id", "label"]),
        ],
        batch_size=BATCH,
        shuffle=True,
        num_workers=2,
        multiprocessing_context="fork",
        timeout=60,
    )
    expected = Counter([*live, *range(10_000, 10_100)])
    for epoch in range(2):
        loader.set_epoch(epoch)
        assert Counter(_ids(list(loader))) == expected


def test_packing_a_token_list_column_reads_every_live_token_once(
    table: tuple[Path, list[int]],
) -> None:
    root, live = table
    expected = Counter(t for i in live for t in range(i, i + i % 5 + 1))
    loader = _loader(
        root, num_workers=2, packing=tdu.Packing("tokens", seq_len=8, pad_value=-1), batch_size=4
    )
    got: Counter[int] = Counter()
    for batch in loader:
        ids = np.asarray(batch["input_ids"]).reshape(-1)
        got.update(int(t) for t in ids[ids >= 0])
    assert got == expected


def test_rows_at_names_the_data_file_and_row(tmp_path: Path) -> None:
    root = tmp_path / "t"
    write_dv_table(root, mode="name")
    loader = _loader(root, num_workers=2)
    loader.set_epoch(2)
    seen = set()
    for b, batch in enumerate(loader):
        found = loader.rows_at(b, epoch=2)
        assert found.column("id").to_pylist() == [int(i) for i in batch["id"]]
        for file, row, i in zip(
            found.column("__file__").to_pylist(),
            found.column("__row__").to_pylist(),
            found.column("id").to_pylist(),
            strict=True,
        ):
            name = Path(file).name
            assert Path(file).parent == root and i in DV_PARTS[name]  # the file holding it
            seen.add(name)
            # Its physical row in the file: past the deleted rows before it (part-0 has a
            # whole row group deleted).
            assert DV_PARTS[name][row] == i
    assert seen == {"part-0.parquet", "part-1.parquet", "part-3.parquet"}  # part-2: all deleted


def test_a_state_saved_at_one_version_is_refused_at_another(tmp_path: Path) -> None:
    root = tmp_path / "t"
    table = HandTable(root)
    table.commit([table.write_file("a.parquet", range(100), row_group_size=10)])
    table.commit([table.write_file("b.parquet", range(100, 150), row_group_size=10)])  # v1
    saving = _loader(root, num_workers=0)
    reference = _ids(list(_loader(root, num_workers=0)))
    assert sorted(reference) == list(range(150))
    done = list(islice(iter(saving), 3))
    state = pickle.loads(pickle.dumps(saving.state_dict()))
    table.commit([table.write_file("c.parquet", range(500, 520), row_group_size=10)])  # v2
    with pytest.raises(StateMismatchError, match="pass version=1"):
        _loader(root, num_workers=0).load_state_dict(state)
    resumed = _loader(root, num_workers=0, version=1)
    resumed.load_state_dict(state)
    assert _ids(done) + _ids(list(resumed)) == reference  # the rest, none of v2's rows
    newest = _loader(root, num_workers=0)
    assert sorted(_ids(list(newest))) == [*range(150), *range(500, 520)]
    as_of = _loader(root, num_workers=0, as_of="2999-01-01T00:00:00Z")
    assert sorted(_ids(list(as_of))) == [*range(150), *range(500, 520)]


def test_the_node_cache_reads_the_same_rows_again(
    table: tuple[Path, list[int]], tmp_path: Path
) -> None:
    root, live = table
    loader = _loader(root, num_workers=2, cache_dir=str(tmp_path / "cache"))
    for epoch in range(2):
        loader.set_epoch(epoch)
        assert Counter(_ids(list(loader))) == Counter(live)
    assert any((tmp_path / "cache").rglob("*"))  # the second epoch read from it


def test_the_first_block_is_decoded_in_its_own_batches(
    tmp_path: Path, quick_batches: QuickBatches
) -> None:
    """The table's format passes the first block's rows on to its Parquet reads
    (`Format.quick_start`): the first row group is decoded in batches of that size, and the
    rows come in the same order as without."""
    from deltalake import write_deltalake

    write_deltalake(str(tmp_path / "t"), pa.table(make_rows(range(1000))))

    def order() -> list[int]:
        ids = _ids(list(_loader(tmp_path / "t", shuffle_block_size=128, num_workers=0)))
        assert Counter(ids) == Counter(range(1000))
        return ids

    quick = order()
    assert any(quick_batches.taken)
    quick_batches.never()
    assert order() == quick and not any(quick_batches.taken)
