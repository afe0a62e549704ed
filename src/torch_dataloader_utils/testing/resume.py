"""Checks of the resume contract of a loader: plain functions that raise `AssertionError`.

A loader's ``state_dict()`` taken after ``k`` batches and loaded into a freshly built loader
must continue with exactly the batches an uninterrupted run yields (same topology), and, on
another topology, deal the rows left of the epoch to the new streams, none lost or repeated
(docs/concepts/model.md). Batches are compared by their ids. The checks need no test runner.
"""

from __future__ import annotations

import pickle
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from itertools import islice
from typing import Any

from ..loader import TabularDataLoader

__all__ = ["check_elastic_resume", "check_resume"]

Batches = list[list[Any]]
MakeLoader = Callable[[], TabularDataLoader[Any]]
MakeLoaderFor = Callable[[int, int, int], TabularDataLoader[Any]]


def _expect(ok: bool, message: str) -> None:
    if not ok:  # never `assert`: the checks must hold under `python -O` too
        raise AssertionError(message)


def _ids(batch: Any, id_column: str) -> list[Any]:
    column = batch.column(id_column) if hasattr(batch, "column") else batch[id_column]
    for convert in ("tolist", "to_pylist"):  # tensor or numpy; arrow
        if hasattr(column, convert):
            return list(getattr(column, convert)())
    return list(column)


def _take(loader: TabularDataLoader[Any], id_column: str, count: int | None = None) -> Batches:
    """The ids of the next ``count`` batches of a pass over ``loader`` (``None``: all)."""
    return [_ids(batch, id_column) for batch in islice(loader, count)]


def _saved(loader: TabularDataLoader[Any]) -> dict[str, Any]:
    """``loader.state_dict()``, checked to be a plain dict, round-tripped through pickle."""
    state = loader.state_dict()
    _expect(isinstance(state, dict), f"state_dict() returned {type(state)}, not a dict")
    copy: dict[str, Any] = pickle.loads(pickle.dumps(state))
    _expect(copy == state, "state_dict() does not survive pickling unchanged")
    return copy


def _flat(batches: Iterable[Sequence[Any]]) -> list[Any]:
    return [i for batch in batches for i in batch]


def _compare(got: Batches, want: Batches, what: str) -> None:
    if got == want:
        return
    if len(got) != len(want):
        detail = f"{len(got)} batches, expected {len(want)}"
    else:
        i = next(i for i, (g, w) in enumerate(zip(got, want, strict=True)) if g != w)
        detail = f"batch {i} has ids {got[i][:8]}..., expected {want[i][:8]}..."
    missing = Counter(_flat(want)) - Counter(_flat(got))
    extra = Counter(_flat(got)) - Counter(_flat(want))
    raise AssertionError(
        f"{what}: {detail}; missing ids {list(missing)[:10]}, unexpected or repeated ids "
        f"{list(extra)[:10]}"
    )


def _check_rows(batches: Batches, expected_ids: Sequence[Any] | None, what: str) -> None:
    """Every row once: no id repeated, and exactly ``expected_ids`` when given."""
    ids = Counter(_flat(batches))
    repeated = [i for i, n in ids.items() if n > 1]
    _expect(not repeated, f"{what}: ids read more than once: {repeated[:10]}")
    if expected_ids is not None:
        missing, extra = Counter(expected_ids) - ids, ids - Counter(expected_ids)
        _expect(
            not missing and not extra,
            f"{what}: missing ids {list(missing)[:10]}, unexpected ids {list(extra)[:10]}",
        )


def _epochs(
    loader: TabularDataLoader[Any], id_column: str, epochs: int
) -> tuple[list[Batches], list[dict[str, Any]]]:
    """The batches of each epoch of an uninterrupted run, and the state after each epoch."""
    batches, states = [], []
    for epoch in range(epochs):
        loader.set_epoch(epoch)
        batches.append(_take(loader, id_column))
        states.append(_saved(loader))
    return batches, states


def _positions(positions: Sequence[int] | None, total: int) -> list[int]:
    if positions is None:
        positions = (0, 1, total // 2, total - 1, total)
    return sorted({k for k in positions if 0 <= k <= total})


def _check_epoch_of(loader: TabularDataLoader[Any], epoch: int, what: str) -> None:
    now = loader.dataset.epoch
    _expect(now == epoch, f"{what}: load_state_dict set epoch {now}, not {epoch}")


def _check_position(
    make_loader: MakeLoader, reference: list[Batches], k: int, *, id_column: str
) -> None:
    """(a) the rest of epoch 0 after ``k`` batches, then (b) the later epochs."""
    interrupted = make_loader()
    interrupted.set_epoch(0)
    head = _take(interrupted, id_column, k)
    state = _saved(interrupted)
    del interrupted
    resumed = make_loader()
    resumed.load_state_dict(state)
    if k < len(reference[0]):
        _check_epoch_of(resumed, 0, f"resume after {k} batches")
        rest = _take(resumed, id_column)
        _compare(head + rest, reference[0], f"{k} batches, then the resumed rest of epoch 0")
        start = 1
    else:  # a complete epoch: set_epoch(0) asks for its rest, which is empty
        _check_epoch_of(resumed, 0, f"resume after all {k} batches of epoch 0")
        resumed.set_epoch(0)  # a training loop's first turn: must not read epoch 0 again
        _compare(_take(resumed, id_column), [], "epoch 0 resumed after its last batch")
        start = 1
    for epoch in range(start, len(reference)):
        resumed.set_epoch(epoch)
        got = _take(resumed, id_column)
        _compare(got, reference[epoch], f"epoch {epoch} after resuming epoch 0 at batch {k}")


def check_resume(
    make_loader: MakeLoader,
    *,
    id_column: str = "id",
    epochs: int = 2,
    positions: Sequence[int] | None = None,
    expected_ids: Sequence[Any] | None = None,
) -> None:
    """Check that the loader resumes exactly where its state says, on the same topology.

    An uninterrupted run of ``epochs`` epochs is the reference. For each position ``k`` in
    epoch 0, a fresh loader reads ``k`` batches and saves its state; another fresh loader loads
    it and must yield (a) the rest of epoch 0 batch by batch, then (b) the same later epochs.
    Also (c) the state of a loader that has not started resumes the whole epoch, (d) the state
    at the end of an epoch goes on with the next epoch (``set_epoch`` of the saved epoch: nothing
    more of it; ``set_epoch`` of the next one reads it as usual), and (e) every epoch reads
    every row once (exactly ``expected_ids`` when given).

    Args:
        make_loader: builds a fresh loader, with the same options each call.
        id_column: a column of hashable values identifying rows.
        epochs: epochs of the reference run (at least 2).
        positions: batches read before saving (default: 0, 1, the middle, the last but one and
            the end of epoch 0).
        expected_ids: the ids an epoch reads (default: only checks that none repeats).

    Raises:
        AssertionError: a resumed run differs from the uninterrupted one; the message says
            where and which ids.

    Example:
        >>> from torch_dataloader_utils import create_dataloader  # doctest: +SKIP
        >>> from torch_dataloader_utils.testing import check_resume
        >>> check_resume(lambda: create_dataloader("data/", batch_size=64, shuffle=True,
        ...                                        num_workers=2, timeout=60))
    """
    if epochs < 2:
        raise ValueError(f"epochs must be at least 2 (the epoch after a resume), got {epochs}")
    reference, ends = _epochs(make_loader(), id_column, epochs)
    for epoch, batches in enumerate(reference):  # (e)
        _check_rows(batches, expected_ids, f"epoch {epoch} of the uninterrupted run")
    end = make_loader()  # (d): the state once a whole pass is read
    end.load_state_dict(ends[0])
    _check_epoch_of(end, 0, "resume at the end of epoch 0")
    end.set_epoch(0)  # a training loop's first turn: must not read epoch 0 again
    _compare(_take(end, id_column), [], "epoch 0 resumed from its end")
    end.set_epoch(1)
    _compare(_take(end, id_column), reference[1], "epoch 1 after resuming the end of epoch 0")
    going_on = make_loader()  # (d) without set_epoch: the next pass is the next epoch
    going_on.load_state_dict(ends[0])
    got = _take(going_on, id_column)
    _compare(got, reference[1], "the pass after resuming the end of epoch 0, no set_epoch")
    initial = make_loader()  # (c)
    state = _saved(initial)
    restarted = make_loader()
    restarted.load_state_dict(state)
    _check_epoch_of(restarted, 0, "resume from the initial state")
    _compare(_take(restarted, id_column), reference[0], "epoch 0 from the initial state")
    for k in _positions(positions, len(reference[0])):  # (a), (b)
        _check_position(make_loader, reference, k, id_column=id_column)


@dataclass
class _OldRun:
    """What the old topology did: rank 0's state, ids delivered before it, ids of its epoch."""

    state: dict[str, Any]
    complete: bool  # rank 0 had read its whole epoch when it saved
    delivered: list[Any] = field(default_factory=list)
    epoch_ids: list[Any] = field(default_factory=list)


def _read_old(
    make_loader_for: MakeLoaderFor,
    old: tuple[int, int],
    batches: int,
    *,
    id_column: str,
    epoch: int,
) -> _OldRun:
    """Every old rank reads ``batches`` batches of ``epoch`` (rank 0 saves), then the rest."""
    world_size, num_workers = old
    run: _OldRun | None = None
    for rank in range(world_size):
        loader = make_loader_for(rank, world_size, num_workers)
        loader.set_epoch(epoch)
        iterator = iter(loader)
        head = [_ids(b, id_column) for b in islice(iterator, batches)]
        state = _saved(loader) if run is None else run.state
        tail = [_ids(b, id_column) for b in iterator]  # the same pass, uninterrupted
        del iterator
        run = run or _OldRun(state, complete=not tail)
        run.delivered += _flat(head)
        run.epoch_ids += _flat(head + tail)
    if run is None:
        raise ValueError(f"old={old}: no ranks")
    return run


def _read_new(
    make_loader_for: MakeLoaderFor, new: tuple[int, int], state: dict[str, Any] | None, epoch: int
) -> list[TabularDataLoader[Any]]:
    """A loader for every rank of ``new``: resuming ``state`` (which must resume at ``epoch``),
    or, without a state, set to ``epoch``."""
    loaders = []
    for rank in range(new[0]):
        loader = make_loader_for(rank, *new)
        if state is None:
            loader.set_epoch(epoch)
        else:
            loader.load_state_dict(state)
            _check_epoch_of(loader, epoch, f"rank {rank} of {new} resuming a state")
        loaders.append(loader)
    return loaders


def _slack(loader: TabularDataLoader[Any], world_size: int) -> tuple[int, int]:
    """Rows a topology's remainder policy may leave out of what it reads, and read twice."""
    dataset = loader.dataset
    lost = world_size - 1 if dataset.remainder == "drop" else 0
    repeated = world_size - 1 if dataset.remainder == "pad" else 0
    if dataset.drop_last:
        lost += world_size * (dataset.batch_size - 1)
    return lost, repeated


def _repeats(ids: Iterable[Any]) -> int:
    return sum(n - 1 for n in Counter(ids).values())


def _check_dealt(old: _OldRun, resumed: list[Any], slack: tuple[int, int, int], where: str) -> None:
    """``old.delivered + resumed`` is ``old.epoch_ids`` up to ``slack``: (rows the old policy
    leaves out, rows the new policy leaves out, rows either may repeat)."""
    old_lost, new_lost, repeats_ok = slack
    got, want = Counter(old.delivered + resumed), set(old.epoch_ids)
    unknown, lost = set(got) - want, want - set(got)
    # Before any batch, the state is a fresh epoch: the new topology may read rows that the
    # old one's remainder left out.
    unknown_ok = old_lost if not old.delivered else 0
    _expect(
        len(unknown) <= unknown_ok,
        f"{where}: ids the old topology never reads: {sorted(unknown)[:10]}",
    )
    _expect(
        len(lost) <= new_lost,
        f"{where}: {len(lost)} ids lost (at most {new_lost} allowed): {sorted(lost)[:10]}",
    )
    repeated = _repeats(old.delivered + resumed)
    twice = [i for i, n in got.items() if n > 1]
    _expect(
        repeated <= repeats_ok,
        f"{where}: {repeated} rows read twice (at most {repeats_ok} allowed): {twice[:10]}",
    )


def check_elastic_resume(
    make_loader_for: MakeLoaderFor,
    *,
    old: tuple[int, int],
    new: tuple[int, int],
    batches: int,
    id_column: str = "id",
    epoch: int = 0,
) -> None:
    """Check that a state resumes on another topology: the rest of the epoch, dealt anew.

    Every rank of the ``old`` topology reads ``batches`` batches of ``epoch``; rank 0's state is
    loaded on every rank of the ``new`` topology, which reads to the end of the epoch. The ids
    delivered before and after must be the ids the old topology reads in the whole epoch, none
    repeated, less at most what the new remainder policy leaves out (``"drop"``: fewer than
    the new world size; ``drop_last``: each new rank's short batch; ``"pad"`` repeats instead);
    and unless ``remainder="uneven"`` every new rank must yield the same number of batches.
    When ``batches`` covers rank 0's whole epoch, the new ranks' next pass must read the next
    epoch as if they had started it (after ``set_epoch(epoch)``: nothing more of the old one).

    Args:
        make_loader_for: ``(rank, world_size, num_workers)`` → a fresh loader for that rank
            (the same data and options otherwise).
        old: ``(world_size, num_workers)`` that saves the state.
        new: ``(world_size, num_workers)`` that resumes it.
        batches: batches each old rank reads before rank 0 saves.
        id_column: a column of hashable values identifying rows.
        epoch: the epoch interrupted.

    Raises:
        AssertionError: a row is lost or repeated, or new ranks yield unequal batch counts.

    Example:
        >>> from torch_dataloader_utils import create_dataloader  # doctest: +SKIP
        >>> from torch_dataloader_utils.testing import check_elastic_resume
        >>> def make(rank, world_size, num_workers):
        ...     return create_dataloader("data/", batch_size=64, shuffle=True, rank=rank,
        ...                              world_size=world_size, num_workers=num_workers)
        >>> check_elastic_resume(make, old=(2, 1), new=(3, 2), batches=5)
    """
    run = _read_old(make_loader_for, old, batches, id_column=id_column, epoch=epoch)
    where = f"epoch {epoch}, {batches} batches on {old} (world_size, num_workers), resumed on {new}"
    if run.complete:
        fresh = _read_new(make_loader_for, new, None, epoch + 1)
        for rank, loader in enumerate(_read_new(make_loader_for, new, run.state, epoch)):
            want = _take(fresh[rank], id_column)
            if rank == 0:  # set_epoch(saved epoch) asks for the rest of it: nothing
                loader.set_epoch(epoch)
                finished = _take(loader, id_column)
                _compare(finished, [], f"{where}: rank {rank}, the finished epoch")
                loader.set_epoch(epoch + 1)
            # Without set_epoch, the pass after a complete epoch reads the next one.
            _compare(_take(loader, id_column), want, f"{where}: rank {rank}, the next epoch")
        return
    loaders = _read_new(make_loader_for, new, run.state, epoch)
    rest = [_take(loader, id_column) for loader in loaders]
    old_lost, old_repeats = _slack(loaders[0], old[0])
    new_lost, new_repeats = _slack(loaders[0], new[0])
    repeated = _repeats(run.epoch_ids)
    _expect(repeated <= old_repeats, f"{where}: the old topology reads {repeated} rows twice")
    resumed = [i for batches_of_rank in rest for i in _flat(batches_of_rank)]
    _check_dealt(run, resumed, (old_lost, new_lost, old_repeats + new_repeats), where)
    counts = [len(batches_of_rank) for batches_of_rank in rest]
    if loaders[0].dataset.remainder != "uneven":
        _expect(len(set(counts)) == 1, f"{where}: new ranks yield unequal batch counts {counts}")
