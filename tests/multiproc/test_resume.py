"""Resume with real DataLoader worker processes (fork and spawn).

A state saved after ``k`` batches and loaded into a loader continues with exactly the batches an
uninterrupted run yields: into a fresh loader, into one whose persistent workers are already
running, across an epoch boundary; on another number of workers it reads every row left in
the epoch once. Changed data is refused unless allowed. The oracle is an uninterrupted run with
the same options (tests/multiproc/test_workers.py checks those runs against the model), and
every test checks the multiset of ids. Workers are real processes, so every loader has a timeout.
"""

from __future__ import annotations

import pickle
import shutil
import warnings
from collections import Counter
from itertools import islice
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import torch_dataloader_utils as tdu
from tests.conftest import write_parquet

pytestmark = [
    pytest.mark.timeout(120),
    pytest.mark.filterwarnings("ignore:This DataLoader will create:UserWarning"),
]

# (rows, row group size) per file: uneven files, row groups of different sizes; ids 0..1599.
FILES = ((250, 100), (1000, 64), (0, 10), (333, 50), (17, 5))
ROWS = 1600
SEED = 7

Batches = list[list[int]]


def write_files(root: Path, files: tuple[tuple[int, int], ...], *, first_id: int = 0) -> int:
    """Write ``files`` to ``root`` with consecutive ids from ``first_id``; returns the rows."""
    start = first_id
    for i, (rows, row_group) in enumerate(files):
        ids = np.arange(start, start + rows)
        write_parquet(root / f"part-{first_id + i:05d}.parquet", ids, row_group_size=row_group)
        start += rows
    return start - first_id


@pytest.fixture
def source(tmp_path: Path) -> Path:
    root = tmp_path / "data"
    assert write_files(root, FILES) == ROWS
    return root


def make_loader(root: Path, **options: Any) -> tdu.TabularDataLoader:
    options = {"batch_size": 60, "shuffle": True, "shuffle_seed": SEED, **options}
    if options.get("num_workers"):
        options.setdefault("multiprocessing_context", "fork")
        options.setdefault("timeout", 60)  # a stuck worker fails the test instead of hanging it
        options.setdefault("bundle_rows", 2 * options["batch_size"])  # several messages each
    return tdu.create_dataloader(root, format="parquet", **options)


def read(loader: tdu.TabularDataLoader, count: int | None = None) -> Batches:
    """The ids of the next ``count`` batches of a new pass over ``loader`` (``None``: all)."""
    return [batch["id"].tolist() for batch in islice(loader, count)]


def flat(batches: Batches) -> list[int]:
    return [i for batch in batches for i in batch]


def saved(loader: tdu.TabularDataLoader) -> dict[str, Any]:
    """The loader's state as a checkpoint would bring it back."""
    state: dict[str, Any] = pickle.loads(pickle.dumps(loader.state_dict()))
    return state


def reference(root: Path, epochs: int, **options: Any) -> list[Batches]:
    """Every epoch of an uninterrupted run."""
    loader = make_loader(root, **options)
    out = []
    for epoch in range(epochs):
        loader.set_epoch(epoch)
        out.append(read(loader))
        assert Counter(flat(out[-1])) == Counter(range(ROWS))
    return out


def interrupted(
    root: Path, batches: int, *, epoch: int = 0, **options: Any
) -> tuple[Batches, dict[str, Any]]:
    """The first ``batches`` batches of ``epoch`` on a new loader, and its state then."""
    loader = make_loader(root, **options)
    loader.set_epoch(epoch)
    head = read(loader, batches)
    return head, saved(loader)


def assert_every_row_once(batches: Batches, rows: int = ROWS) -> None:
    ids = Counter(flat(batches))
    assert ids == Counter(range(rows)), (
        f"missing {sorted(Counter(range(rows)) - ids)[:10]}, "
        f"extra {sorted(ids - Counter(range(rows)))[:10]}"
    )


# --- the same topology: exact, batch by batch ------------------------------------------------


@pytest.mark.parametrize(
    ("num_workers", "batch_size"),
    [(2, 60), (3, 25), (1, 7)],  # 27, 64 and 229 batches; 2-batch bundles
)
def test_persistent_workers_resume_in_place(
    source: Path, num_workers: int, batch_size: int
) -> None:
    options = {"num_workers": num_workers, "batch_size": batch_size}
    ref = reference(source, 3, **options)
    loader = make_loader(source, persistent_workers=True, **options)
    assert read(loader) == ref[0]  # the workers are running
    loader.set_epoch(1)
    k = len(ref[1]) // 2 + 1
    head = read(loader, k)
    state = saved(loader)
    loader.load_state_dict(state)  # into the workers that read the head
    rest = read(loader)
    assert head + rest == ref[1]
    assert_every_row_once(head + rest)
    loader.set_epoch(2)
    assert read(loader) == ref[2]
    loader.load_state_dict(state)  # again, now that the workers have read epoch 2
    assert read(loader) == ref[1][k:]
    loader.set_epoch(2)
    assert read(loader) == ref[2]


@pytest.mark.parametrize("persistent", [False, True])
def test_resume_across_the_epoch_boundary(source: Path, persistent: bool) -> None:
    ref = reference(source, 3, num_workers=2)

    def fresh() -> tdu.TabularDataLoader:
        return make_loader(source, num_workers=2, persistent_workers=persistent)

    loader = fresh()
    assert read(loader) == ref[0]
    end_of_0 = saved(loader)  # the pass ran to its end
    loader.set_epoch(1)
    last = read(loader, len(ref[1]))  # every batch of epoch 1, the pass not yet ended
    assert last == ref[1]
    end_of_1 = saved(loader)
    for state, epoch in ((end_of_0, 0), (end_of_1, 1)):  # resumes at the end of its epoch
        resumed = fresh()
        resumed.load_state_dict(state)
        assert resumed.dataset.epoch == epoch
        resumed.set_epoch(epoch)  # a loop restarting at the saved epoch reads nothing of it
        assert read(resumed) == []
        resumed.set_epoch(epoch + 1)
        assert read(resumed) == ref[epoch + 1]
    # A training loop calls set_epoch(epoch) after loading its checkpoint: the state stays.
    head, state = interrupted(source, 9, epoch=1, num_workers=2)
    resumed = fresh()
    resumed.load_state_dict(state)
    got = []
    for epoch in (1, 2):
        resumed.set_epoch(epoch)
        got.append(read(resumed))
    assert [head + got[0], got[1]] == ref[1:]
    assert_every_row_once(head + got[0])


@pytest.mark.parametrize("batch_size", [60, 16])
def test_resuming_twice_on_the_same_topology(source: Path, batch_size: int) -> None:
    options = {"num_workers": 2, "batch_size": batch_size}
    (ref,) = reference(source, 1, **options)
    head, state = interrupted(source, 5, **options)
    second = make_loader(source, **options)
    second.load_state_dict(state)
    middle = read(second, 7)
    third = make_loader(source, persistent_workers=True, **options)
    third.load_state_dict(saved(second))
    rest = read(third)
    assert head + middle + rest == ref
    assert_every_row_once(head + middle + rest)


# --- another number of workers: every row left, once ----------------------------------------


@pytest.mark.parametrize(
    ("old", "new", "batch_size"), [(0, 2, 60), (2, 3, 60), (2, 3, 25), (3, 1, 16), (2, 0, 33)]
)
def test_other_num_workers_on_resume(source: Path, old: int, new: int, batch_size: int) -> None:
    head, state = interrupted(source, 7, num_workers=old, batch_size=batch_size)
    loader = make_loader(source, num_workers=new, batch_size=batch_size)
    loader.load_state_dict(state)
    rest = read(loader)
    assert_every_row_once(head + rest)
    assert all(len(b) == batch_size for b in head)
    assert len([b for b in rest if len(b) != batch_size]) <= max(new, 1)  # one per stream
    loader.set_epoch(1)  # the next epoch is an ordinary one on the new topology
    assert read(loader) == reference(source, 2, num_workers=new, batch_size=batch_size)[1]


def test_resumes_chained_across_topologies(source: Path) -> None:
    head, state = interrupted(source, 5, num_workers=2, epoch=1)
    second = make_loader(source, num_workers=3, persistent_workers=True)
    second.load_state_dict(state)
    middle = read(second, 4)
    third = make_loader(source, num_workers=0)
    third.load_state_dict(saved(second))
    assert third.dataset.epoch == 1
    rest = read(third)
    assert_every_row_once(head + middle + rest)
    third.set_epoch(2)
    assert read(third) == reference(source, 3, num_workers=0)[2]


# --- the state: refuses changed data, small, no secrets --------------------------------------


def test_changed_data_is_refused_unless_allowed(source: Path) -> None:
    head, state = interrupted(source, 4, num_workers=2)
    added = write_files(source, ((10, 4),), first_id=ROWS)  # one more file after the save
    loader = make_loader(source, num_workers=2)
    with pytest.raises(tdu.StateMismatchError, match=r"rows: 1600 then, 1610 now") as error:
        loader.load_state_dict(state)
    assert "files: 5 then, 6 now" in str(error.value)
    assert "allow_changed_data=True" in str(error.value)
    loader.load_state_dict(state, allow_changed_data=True)  # same epoch and batch, new data
    assert loader.dataset.epoch == 0
    rest = read(loader)
    assert len(head) + len(rest) == len(loader)
    ids = Counter(flat(rest))
    assert max(ids.values()) == 1 and set(ids) <= set(range(ROWS + added))
    loader.set_epoch(1)
    assert_every_row_once(read(loader), ROWS + added)


def test_moving_on_from_a_loaded_state_warns_unless_its_epoch_was_complete(source: Path) -> None:
    loader = make_loader(source)
    loader.set_epoch(0)
    assert Counter(flat(read(loader))) == Counter(range(ROWS))
    end = saved(loader)
    _, middle = interrupted(source, 5)
    finished = make_loader(source)
    finished.load_state_dict(end)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no warning: nothing of epoch 0 was left
        finished.set_epoch(1)
    assert_every_row_once(read(finished))
    dropped = make_loader(source)
    dropped.load_state_dict(middle)
    with pytest.warns(UserWarning, match=r"middle of epoch 0: the rest of that epoch will not"):
        dropped.set_epoch(1)
    assert_every_row_once(read(dropped))  # epoch 1, whole


def test_moved_data_resumes_exactly(source: Path, tmp_path: Path) -> None:
    """The fingerprint names files relative to their folder: a copy elsewhere still resumes."""
    full = reference(source, 1, num_workers=2)[0]
    head, state = interrupted(source, 5, num_workers=2)
    moved = tmp_path / "elsewhere" / "copy"
    shutil.copytree(source, moved)
    loader = make_loader(moved, num_workers=2)
    loader.load_state_dict(state)
    rest = read(loader)
    assert head + rest == full
    assert_every_row_once(head + rest)
    (moved / "part-00001.parquet").rename(moved / "renamed.parquet")
    with pytest.raises(tdu.StateMismatchError, match="other files"):
        make_loader(moved, num_workers=2).load_state_dict(state)


def test_other_columns_are_refused(source: Path) -> None:
    head, state = interrupted(source, 3, columns=["id", "x"])
    loader = make_loader(source, columns=["id"])
    with pytest.raises(tdu.StateMismatchError, match="the same counts, but other"):
        loader.load_state_dict(state)
    loader = make_loader(source, columns=["id", "x"])
    loader.load_state_dict(state)
    assert_every_row_once(head + read(loader))


def test_state_is_small_and_holds_no_secrets(tmp_path: Path) -> None:
    root = tmp_path / "many"
    sizes = tuple((3 + i % 5, 2) for i in range(300))  # 300 files, 1500 rows, 900 row groups
    rows = write_files(root, sizes)

    def make(num_workers: int) -> tdu.TabularDataLoader:
        options = {"storage_options": {"secret": "hunter2"}, "num_workers": num_workers}
        return make_loader(root, batch_size=50, **options)

    first = make(2)
    head = read(first, 4)
    states = [saved(first)]
    second = make(3)  # elastic: the state then carries the old topology too
    second.load_state_dict(states[0])
    middle = read(second, 5)
    states.append(saved(second))
    for state in states:
        assert len(pickle.dumps(state)) < 4096, len(pickle.dumps(state))
        assert "hunter2" not in repr(state) and b"hunter2" not in pickle.dumps(state)
    third = make(0)
    third.load_state_dict(states[1])
    assert_every_row_once(head + middle + read(third), rows)


# --- spawn: the state crosses to the workers by pickle ---------------------------------------


@pytest.mark.slow
def test_spawn_resumes_in_place_and_on_more_workers(source: Path) -> None:
    ref = reference(source, 2, num_workers=2)  # fork: the order does not depend on the start
    spawn = {"multiprocessing_context": "spawn", "persistent_workers": True}
    loader = make_loader(source, num_workers=2, **spawn)
    head = read(loader, 6)
    state = saved(loader)
    loader.load_state_dict(state)  # persistent spawn workers: restarted with the state
    assert head + read(loader) == ref[0]
    loader.set_epoch(1)
    assert read(loader) == ref[1]
    more = make_loader(source, num_workers=3, **spawn)
    more.load_state_dict(state)  # elastic: the remaining rows are computed in the workers
    rest = read(more)
    assert_every_row_once(head + rest)
    more.set_epoch(1)
    assert read(more) == reference(source, 2, num_workers=3)[1]
