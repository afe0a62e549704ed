"""`rows_at`: the rows of any batch, computed from the plan, are exactly the rows the loader
delivers as that batch, for every batch, epoch, rank and worker count, shuffled or not; and
each row's file and row number in it are right."""

from __future__ import annotations

import itertools
import json
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

import torch_dataloader_utils as tdu
from torch_dataloader_utils.cli import main

pytestmark = [
    pytest.mark.timeout(300),
    pytest.mark.filterwarnings("ignore:This DataLoader will create:UserWarning"),
]


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Four files of 37-61 rows in row groups of 9; ``id`` = file * 1000 + row."""
    root = tmp_path_factory.mktemp("rows_at")
    for f, n in enumerate((37, 61, 44, 50)):
        ids = np.arange(n) + 1000 * f
        table = pa.table({"id": pa.array(ids, pa.int64()), "x": pa.array(ids * 0.5)})
        pq.write_table(table, root / f"part-{f}.parquet", row_group_size=9)
    return root


def make(root: Path, **options: Any) -> Any:
    return tdu.create_dataloader(str(root), batch_size=7, **options)


# Shuffled: every world size 1-4 with every worker count 0-3; unshuffled, a few of them.
GRID = [(w, n, True) for w in range(1, 5) for n in range(4)]
GRID += [(1, 0, False), (1, 2, False), (2, 0, False), (3, 2, False), (2, 3, False)]


@pytest.mark.parametrize(("world_size", "workers", "shuffle"), GRID)
def test_every_batch_looked_up_is_the_batch_delivered(
    data: Path, world_size: int, workers: int, shuffle: bool
) -> None:
    for epoch in (0, 2):
        for rank in range(world_size):
            loader = make(
                data, rank=rank, world_size=world_size, num_workers=workers, shuffle=shuffle
            )
            loader.set_epoch(epoch)
            delivered = [b["id"].tolist() for b in loader]
            for b, ids in enumerate(delivered):
                table = loader.rows_at(b, epoch=epoch)
                assert table.column("id").to_pylist() == ids
                files = table.column("__file__").to_pylist()
                rows = table.column("__row__").to_pylist()
                for i, f, r in zip(ids, files, rows, strict=True):
                    assert f.endswith(f"part-{i // 1000}.parquet") and r == i % 1000
            with pytest.raises(tdu.InvalidArgumentError, match="not a batch of rank"):
                loader.rows_at(len(delivered), epoch=epoch)


def test_another_ranks_batch_is_looked_up_from_this_one(data: Path) -> None:
    other = make(data, rank=1, world_size=2, shuffle=True)
    other.set_epoch(1)
    expected = [b["id"].tolist() for b in other]
    mine = make(data, rank=0, world_size=2, shuffle=True)
    for b, ids in enumerate(expected):
        assert mine.rows_at(b, epoch=1, rank=1).column("id").to_pylist() == ids
    with pytest.raises(tdu.InvalidArgumentError, match="rank must be in"):
        mine.rows_at(0, rank=2)


def test_tdu_explain_prints_a_batch_from_a_saved_state(
    data: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    loader = make(data, rank=1, world_size=2, num_workers=2, shuffle=True)
    loader.set_epoch(3)
    delivered = [b["id"].tolist() for b in itertools.islice(loader, 5)]
    state = tmp_path / "state.json"
    state.write_text(json.dumps(loader.state_dict()))
    assert main(["explain", str(data), "--batch", "4", "--rank", "1", "--state", str(state)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "epoch 3, rank 1 of 2, 2 workers, batch 4: 7 rows"
    ids = [int(line.split("id=")[1].split()[0]) for line in out[1:]]
    assert ids == delivered[4]
    for line, i in zip(out[1:], ids, strict=True):
        assert f"part-{i // 1000}.parquet" in line and f"__row__={i % 1000} " in line


@pytest.mark.parametrize(("world_size", "workers"), [(1, 0), (2, 2)])
@pytest.mark.parametrize("mixing", ["random", "stratified"])
def test_a_mixtures_batches_looked_up_are_the_batches_delivered(
    data: Path, tmp_path: Path, world_size: int, workers: int, mixing: str
) -> None:
    other = tmp_path / "other"
    other.mkdir()
    ids = np.arange(90) + 9000
    pq.write_table(pa.table({"id": ids, "x": ids * 0.5}), other / "b.parquet", row_group_size=8)
    for rank in range(world_size):
        loader = tdu.create_dataloader(
            [tdu.Source(str(data), weight=2), tdu.Source(str(other), weight=1)],
            epoch_rows=150,
            mixing=mixing,
            source_column="source",
            batch_size=7,
            shuffle=True,
            rank=rank,
            world_size=world_size,
            num_workers=workers,
        )
        loader.set_epoch(1)  # (a source's passes go on across epochs)
        for b, batch in enumerate(loader):
            table = loader.rows_at(b, epoch=1)
            assert table.column("id").to_pylist() == batch["id"].tolist()
            assert table.column("__source__").to_pylist() == batch["source"].tolist()
            for i, f, r in zip(
                batch["id"].tolist(),
                table.column("__file__").to_pylist(),
                table.column("__row__").to_pylist(),
                strict=True,
            ):
                name = "b.parquet" if i >= 9000 else f"part-{i // 1000}.parquet"
                assert f.endswith(name) and r == (i - 9000 if i >= 9000 else i % 1000)


@pytest.mark.parametrize("workers", [0, 2])
def test_rows_read_through_a_filter_keep_their_numbers_in_the_file(
    data: Path, workers: int
) -> None:
    loader = tdu.create_dataloader(
        str(data),
        batch_size=5,
        shuffle=True,
        num_workers=workers,
        filters=pc.field("id") > 1020,
    )
    loader.set_epoch(1)
    for b, batch in enumerate(loader):
        table = loader.rows_at(b, epoch=1)
        ids = batch["id"].tolist()
        assert table.column("id").to_pylist() == ids and all(i > 1020 for i in ids)
        assert table.column("__row__").to_pylist() == [i % 1000 for i in ids]


@pytest.mark.parametrize(("world_size", "workers"), [(1, 0), (2, 2)])
@pytest.mark.parametrize("shuffle", [False, True])
def test_token_budget_batches_looked_up_are_the_batches_delivered(
    tmp_path: Path, world_size: int, workers: int, shuffle: bool
) -> None:
    rng = np.random.default_rng(2)
    for f in range(3):
        ids = np.arange(70) + 1000 * f
        tokens = [list(range(int(n))) for n in rng.integers(1, 30, 70)]
        table = pa.table({"id": ids, "tokens": pa.array(tokens, pa.list_(pa.int32()))})
        pq.write_table(table, tmp_path / f"part-{f}.parquet", row_group_size=16)
    for rank in range(world_size):
        loader = tdu.create_dataloader(
            str(tmp_path),
            batching=tdu.TokenBudget("tokens", max_tokens=90),
            shuffle=shuffle,
            rank=rank,
            world_size=world_size,
            num_workers=workers,
        )
        loader.set_epoch(1)
        for b, batch in enumerate(loader):
            table = loader.rows_at(b, epoch=1)
            assert table.column("id").to_pylist() == batch["id"].tolist()
            assert table.column("__row__").to_pylist() == [i % 1000 for i in batch["id"].tolist()]


@pytest.mark.parametrize(("world_size", "workers"), [(1, 0), (2, 2)])
@pytest.mark.parametrize("shuffle", [False, True])
def test_packed_batches_looked_up_are_the_pieces_delivered(
    tmp_path: Path, world_size: int, workers: int, shuffle: bool
) -> None:
    """Token ids are unique: id = file * 100,000 + row * 100 + position."""
    rng = np.random.default_rng(4)
    for f in range(3):
        tokens = [
            [f * 100_000 + r * 100 + p for p in range(int(n))]
            for r, n in enumerate(rng.integers(1, 40, 60))
        ]
        table = pa.table({"tokens": pa.array(tokens, pa.list_(pa.int64()))})
        pq.write_table(table, tmp_path / f"part-{f}.parquet", row_group_size=13)
    for rank in range(world_size):
        loader = tdu.create_dataloader(
            str(tmp_path),
            packing=tdu.Packing("tokens", seq_len=16, pad_value=-1),
            batch_size=3,
            shuffle=shuffle,
            rank=rank,
            world_size=world_size,
            num_workers=workers,
        )
        loader.set_epoch(1)
        for b, batch in enumerate(loader):
            ids = [t for t in batch["input_ids"].reshape(-1).tolist() if t >= 0]
            table = loader.rows_at(b, epoch=1)
            expected = []
            for f, r, p, n in zip(
                table.column("__file__").to_pylist(),
                table.column("__row__").to_pylist(),
                table.column("__fragment_start__").to_pylist(),
                table.column("__fragment_tokens__").to_pylist(),
                strict=True,
            ):
                file = int(f.rsplit("part-", 1)[1].split(".")[0])
                expected += [file * 100_000 + r * 100 + p + i for i in range(n)]
            assert expected == ids


@pytest.mark.parametrize(("world_size", "workers"), [(1, 0), (2, 2), (3, 1)])
@pytest.mark.parametrize("mixing", ["random", "stratified"])
def test_a_packed_mixtures_batches_looked_up_are_the_pieces_delivered(
    tmp_path: Path, world_size: int, workers: int, mixing: str
) -> None:
    """Two sources of unique token ids: id = source * 1,000,000 + row * 100 + position."""
    rng = np.random.default_rng(5)
    roots = []
    for s in range(2):
        root = tmp_path / f"source-{s}"
        root.mkdir()
        tokens = [
            [s * 1_000_000 + r * 100 + p for p in range(int(n))]
            for r, n in enumerate(rng.integers(1, 40, 90 - 30 * s))
        ]
        table = pa.table({"tokens": pa.array(tokens, pa.list_(pa.int64()))})
        pq.write_table(table, root / "part.parquet", row_group_size=17)
        roots.append(root)
    for rank in range(world_size):
        loader = tdu.create_dataloader(
            [tdu.Source(str(r)) for r in roots],
            packing=tdu.Packing("tokens", seq_len=16, pad_value=-1),
            batch_size=3,
            shuffle=True,
            mixing=mixing,
            rank=rank,
            world_size=world_size,
            num_workers=workers,
        )
        loader.set_epoch(1)
        for b, batch in enumerate(loader):
            ids = [t for t in batch["input_ids"].reshape(-1).tolist() if t >= 0]
            table = loader.rows_at(b, epoch=1)
            expected = []
            for s, r, p, n in zip(
                table.column("__source__").to_pylist(),
                table.column("__row__").to_pylist(),
                table.column("__fragment_start__").to_pylist(),
                table.column("__fragment_tokens__").to_pylist(),
                strict=True,
            ):
                expected += [s * 1_000_000 + r * 100 + p + i for i in range(n)]
            assert expected == ids


# --- after a resume: batches numbered from the epoch's first, whichever run delivered them ------


@pytest.fixture(scope="module")
def documents(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Three files of 60 documents; ``id`` = file * 1000 + row, each token unique: file *
    100,000 + row * 100 + position."""
    root = tmp_path_factory.mktemp("documents")
    rng = np.random.default_rng(7)
    for f in range(3):
        lengths = rng.integers(1, 40, 60)
        tokens = [[f * 100_000 + r * 100 + p for p in range(int(n))] for r, n in enumerate(lengths)]
        table = pa.table(
            {"id": np.arange(60) + 1000 * f, "tokens": pa.array(tokens, pa.list_(pa.int64()))}
        )
        pq.write_table(table, root / f"part-{f}.parquet", row_group_size=13)
    return root


def loader_of(kind: str, data: Path, documents: Path, **options: Any) -> Any:
    """A loader of ``kind``: rows of one source, a mixture's, packed sequences, token budgets."""
    if kind == "rows":
        return make(data, shuffle=True, **options)
    if kind == "mixture":
        sources = [
            tdu.Source(str(data), weight=2, columns=["id"]),
            tdu.Source(str(documents), columns=["id"]),
        ]
        return tdu.create_dataloader(
            sources, epoch_rows=250, batch_size=7, shuffle=True, source_column="s", **options
        )
    if kind == "packed":
        packing = tdu.Packing("tokens", seq_len=16, pad_value=-1)
        return tdu.create_dataloader(
            str(documents), packing=packing, batch_size=3, shuffle=True, **options
        )
    budget = tdu.TokenBudget("tokens", max_tokens=90)
    return tdu.create_dataloader(str(documents), batching=budget, shuffle=True, **options)


def delivered_ids(kind: str, batch: Any) -> list[int]:
    """A batch's row ids (a packed batch's: its tokens, padding left out)."""
    if kind == "packed":
        return [t for t in batch["input_ids"].reshape(-1).tolist() if t >= 0]
    return list(batch["id"].tolist())


def looked_up(kind: str, loader: Any, batch: int, epoch: int) -> list[int]:
    """The ids `rows_at` gives for ``batch`` (a packed batch's tokens, from its fragments)."""
    table = loader.rows_at(batch, epoch=epoch)
    if kind != "packed":
        return list(table.column("id").to_pylist())
    tokens = []
    for f, r, p, n in zip(
        table.column("__file__").to_pylist(),
        table.column("__row__").to_pylist(),
        table.column("__fragment_start__").to_pylist(),
        table.column("__fragment_tokens__").to_pylist(),
        strict=True,
    ):
        file = int(f.rsplit("part-", 1)[1].split(".")[0])
        tokens += [file * 100_000 + r * 100 + p + i for i in range(n)]
    return tokens


# (saved ranks, workers) -> (ranks, workers): the same topology, then elastic resumes.
RESUMES = [((1, 2), (1, 2)), ((1, 2), (1, 0)), ((2, 2), (3, 0)), ((3, 0), (2, 2))]
SAVED = 4  # batches each rank delivers before the state is saved


@pytest.mark.parametrize("kind", ["rows", "mixture", "packed", "budget"])
@pytest.mark.parametrize(("before", "after"), RESUMES)
def test_rows_at_after_a_resume_are_the_batches_delivered(
    data: Path,
    documents: Path,
    kind: str,
    before: tuple[int, int],
    after: tuple[int, int],
) -> None:
    """Batch ``k`` is the epoch's ``k``-th on the rank: the saved run's before the state, the
    resumed run's after it, looked up before the pass, while it runs and after it."""
    (ranks, workers), (new_ranks, new_workers) = before, after
    first: dict[int, list[list[int]]] = {}
    state = None
    for rank in range(ranks):
        loader = loader_of(kind, data, documents, rank=rank, world_size=ranks, num_workers=workers)
        loader.set_epoch(2)
        first[rank] = [delivered_ids(kind, b) for b in itertools.islice(loader, SAVED)]
        state = loader.state_dict() if rank == 0 else state
    for rank in range(new_ranks):
        loader = loader_of(
            kind, data, documents, rank=rank, world_size=new_ranks, num_workers=new_workers
        )
        loader.load_state_dict(state)
        ahead = looked_up(kind, loader, SAVED, 2)  # (the loaded state's pass, not begun)
        rest = []
        for j, batch in enumerate(loader):
            rest.append(delivered_ids(kind, batch))
            if j == 1:  # (the pass being read)
                assert looked_up(kind, loader, SAVED + 1, 2) == rest[1]
        assert rest and ahead == rest[0]
        for j, ids in enumerate(rest):  # (the pass read last)
            assert looked_up(kind, loader, SAVED + j, 2) == ids, (rank, j)
        if rank < ranks:  # the saved run's batches of this rank
            for b, ids in enumerate(first[rank]):
                assert looked_up(kind, loader, b, 2) == ids, (rank, b)
        else:
            with pytest.raises(tdu.InvalidArgumentError, match="was not one of them"):
                loader.rows_at(0, epoch=2)
        with pytest.raises(tdu.InvalidArgumentError, match="not a batch of rank"):
            loader.rows_at(SAVED + len(rest), epoch=2)


@pytest.mark.parametrize("kind", ["rows", "mixture"])
def test_rows_at_describes_the_pass_this_loader_holds_else_a_fresh_one(
    data: Path, documents: Path, kind: str
) -> None:
    """Which pass `rows_at` describes after an elastic resume (2 ranks with 2 workers, then 3
    ranks with none) inside epoch 2: the batches delivered, every leg's, while the loader holds
    that pass (loaded, read, or the last it read of the epoch, after it moved on too); the
    last pass it read of an epoch when it read the epoch again; and for an epoch it holds no
    pass of, a fresh pass on its own topology, not what the saved run delivered then."""
    saved = loader_of(kind, data, documents, rank=0, world_size=2, num_workers=2)
    saved.set_epoch(1)
    saved_first = [delivered_ids(kind, b) for b in saved]
    saved.set_epoch(2)
    delivered = [delivered_ids(kind, b) for b in itertools.islice(saved, SAVED)]
    loader = loader_of(kind, data, documents, rank=0, world_size=3, num_workers=0)
    loader.load_state_dict(saved.state_dict())
    delivered += [delivered_ids(kind, b) for b in loader]
    loader.set_epoch(3)
    third = [delivered_ids(kind, b) for b in loader]
    assert [looked_up(kind, loader, b, 2) for b in range(len(delivered))] == delivered
    assert [looked_up(kind, loader, b, 3) for b in range(len(third))] == third
    # Epoch 1 was the saved run's, on its topology: this loader describes its own fresh pass.
    fresh = loader_of(kind, data, documents, rank=0, world_size=3, num_workers=0)
    fresh.set_epoch(1)
    first = [delivered_ids(kind, b) for b in fresh]
    assert [looked_up(kind, loader, b, 1) for b in range(len(first))] == first != saved_first
    # Epoch 2 read again, fresh: the pass read last is that one.
    loader.set_epoch(2)
    again = [delivered_ids(kind, b) for b in loader]
    assert [looked_up(kind, loader, b, 2) for b in range(len(again))] == again != delivered


def test_tdu_explain_looks_up_a_packed_runs_batch_from_its_state(
    documents: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A state saved after an elastic resume (2 workers, then 0): batches of both legs."""
    before = loader_of("packed", documents, documents, rank=1, world_size=2, num_workers=2)
    before.set_epoch(3)
    delivered = [delivered_ids("packed", b) for b in itertools.islice(before, 3)]
    loader = loader_of("packed", documents, documents, rank=1, world_size=2, num_workers=0)
    loader.load_state_dict(before.state_dict())
    delivered += [delivered_ids("packed", b) for b in itertools.islice(loader, 3)]
    state = tmp_path / "state.json"
    state.write_text(json.dumps(loader.state_dict()))
    common = [str(documents), "--rank", "1", "--state", str(state), "--limit", "1000"]
    for batch in (1, 4):
        assert main(["explain", *common, "--packing", "tokens", "--batch", str(batch)]) == 0
        out = capsys.readouterr().out.splitlines()
        tokens = sum(len(ids) for ids in [delivered[batch]])
        assert out[0].startswith(f"epoch 3, rank 1 of 2, 1 worker, batch {batch}: ")
        assert out[0].endswith(f" fragments of documents, {tokens} tokens")
        got = []
        for line in out[1:]:
            fields = dict(field.split("=", 1) for field in line.split())
            file = int(fields["__file__"].rsplit("part-", 1)[1].split(".")[0])
            start, count = int(fields["__fragment_start__"]), int(fields["__fragment_tokens__"])
            got += [file * 100_000 + int(fields["__row__"]) * 100 + start + i for i in range(count)]
        assert got == delivered[batch]
    # Without --packing the state is refused, saying what to pass.
    assert main(["explain", *common, "--batch", "1"]) == 2
    assert "--packing COLUMN" in capsys.readouterr().err


def test_rows_at_reads_the_columns_asked_for(data: Path, documents: Path) -> None:
    loader = make(data, shuffle=True, num_workers=2)
    loader.set_epoch(1)
    batches = [b["id"].tolist() for b in loader]
    for b, ids in enumerate(batches):
        table = loader.rows_at(b, epoch=1, columns=["id"])
        assert table.column_names == ["id", "__file__", "__row__"]
        assert table.column("id").to_pylist() == ids
        bare = loader.rows_at(b, epoch=1, columns=[])  # (nothing read: the plan tells)
        assert bare.column_names == ["__file__", "__row__"]
        assert bare.column("__row__").to_pylist() == [i % 1000 for i in ids]
    with pytest.raises(tdu.ColumnNotFoundError, match="nope"):
        loader.rows_at(0, epoch=1, columns=["nope"])
    packed = loader_of("packed", documents, documents, num_workers=2)
    packed.set_epoch(1)
    for b, _ in enumerate(packed):
        table = packed.rows_at(b, epoch=1)
        assert table.column_names == [
            "__fragment_tokens__",
            "__fragment_start__",
            "__file__",
            "__row__",
        ]
        rows = table.column("__row__").to_pylist()
        files = [int(f.rsplit("part-", 1)[1][0]) for f in table.column("__file__").to_pylist()]
        ids = packed.rows_at(b, epoch=1, columns=["id"]).column("id").to_pylist()
        assert ids == [f * 1000 + r for f, r in zip(files, rows, strict=True)]
