"""Packs balanced by compute, read for real (issue 45; docs/adr/0032-balance-by-compute.md):
Parquet token lists, 4 ranks, DataLoader workers (fork and spawn), exact and elastic resume,
token budgets and mixtures. Token ids are unique in the data, so the multiset of token ids
says every token was read once; every step's batches are checked to be the window's batches
grouped by their real cost (read from ``cu_seqlens``), and against the plan-order run."""

from __future__ import annotations

import itertools
import re
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.parquet as pq
import pytest

import torch_dataloader_utils as tdu
from tests.packed_data import PAD, Where, documents, token_table, tokens_of, write_documents
from torch_dataloader_utils.errors import StateMismatchError
from torch_dataloader_utils.planning.balance import straggler_overhead
from torch_dataloader_utils.planning.resume import Pass
from torch_dataloader_utils.planning.topology import Topology

pytestmark = [
    pytest.mark.timeout(300),
    pytest.mark.filterwarnings("ignore:This DataLoader will create:UserWarning"),
]

SEQ_LEN, BATCH, WORLD, WINDOW = 16, 2, 4, 8


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Where]:
    """Four files of 150 documents of 0-29 tokens, row groups of 25; token ids unique."""
    root = tmp_path_factory.mktemp("balance")
    where = write_documents(root, 4, 150, row_group_size=25)
    return root, where


def make(root: Path, rank: int, *, world: int = WORLD, workers: int = 0, **kw: Any) -> Any:
    balance = kw.pop("balance", tdu.Balance(window=WINDOW, cost="attention", linear=2.0))
    context = kw.pop("context", "fork")
    loader = {k: kw.pop(k) for k in ("null_policy",) if k in kw}
    return tdu.create_dataloader(
        str(root),
        format="parquet",
        packing=tdu.Packing("tokens", SEQ_LEN, pad_value=PAD, balance=balance, **kw),
        batch_size=BATCH,
        shuffle=True,
        shuffle_block_size=160,  # (tokens: several blocks a stream)
        rank=rank,
        world_size=world,
        num_workers=workers,
        multiprocessing_context=context if workers else None,
        timeout=60,
        **loader,
    )


def forked(data: Any, rank: int, **kw: Any) -> Any:
    """A shuffled loader of ``data`` (Parquet) on ``rank`` of `WORLD`, 2 forked workers."""
    return tdu.create_dataloader(
        data,
        format="parquet",
        shuffle=True,
        rank=rank,
        world_size=WORLD,
        num_workers=2,
        multiprocessing_context="fork",
        timeout=60,
        **kw,
    )


def cost(batch: dict[str, Any], linear: float = 2.0) -> float:
    """A batch's real cost: its fragments' squared lengths plus ``linear`` a token (padding
    left out), from ``cu_seqlens``."""
    ids = batch["input_ids"].numpy().reshape(-1)
    cu = batch["cu_seqlens"].numpy().astype(np.int64)
    lengths = np.diff(cu)[ids[cu[:-1]] != PAD].astype(np.float64)
    return float((lengths**2).sum() + linear * lengths.sum())


def epoch(
    root: Path, where: Where, epoch: int = 1, **kw: Any
) -> tuple[list[list[dict[str, Any]]], Counter[int]]:
    """Every rank's batches of ``epoch`` and the tokens they hold, after checking each
    batch's boundaries, that no token came twice and all but the remainder's (``"drop"``:
    less than a batch a rank) came, and that every rank has ``len(loader)`` batches."""
    ranks = []
    for rank in range(WORLD):
        loader = make(root, rank, **kw)
        loader.set_epoch(epoch)
        batches = list(loader)
        assert len(batches) == len(loader)
        ranks.append(batches)
    assert len({len(b) for b in ranks}) == 1  # equal batches on every rank
    seen = Counter(
        t
        for batches in ranks
        for b in batches
        for t in tokens_of(b, where, seq_len=SEQ_LEN, batch_size=BATCH)
    )
    assert set(seen.values()) == {1} and set(seen) <= set(where)
    assert len(where) - len(seen) < WORLD * BATCH * SEQ_LEN
    return ranks, seen


def steps(ranks: list[list[dict[str, Any]]]) -> np.ndarray:
    """The real cost of each rank's batch at each step: shape (steps, ranks)."""
    return np.array([[cost(b) for b in batches] for batches in ranks]).T


@pytest.mark.parametrize(
    ("workers", "context", "method"),
    [(0, None, "concat"), (2, "fork", "concat"), (2, "spawn", "concat"), (2, "fork", "best_fit")],
)
def test_every_token_once_and_each_windows_batches_grouped_by_cost(
    data: tuple[Path, Where], workers: int, context: str | None, method: str
) -> None:
    root, where = data
    kw: dict[str, Any] = {"workers": workers, "method": method}
    if context is not None:
        kw["context"] = context
    balanced_ranks, balanced_tokens = epoch(root, where, **kw)
    if context == "spawn":
        return  # (every token once with spawned workers: the grouping is the fork case's)
    plain_ranks, plain_tokens = epoch(root, where, balance=None, **kw)
    assert balanced_tokens == plain_tokens  # the same tokens, each once
    balanced, plain = steps(balanced_ranks), steps(plain_ranks)
    nw = max(workers, 1)
    width = -(-WINDOW // nw)  # each worker's batches a window
    for w in range(nw):
        mine, theirs = balanced[w::nw], plain[w::nw]
        for start in range(0, len(mine), width):
            got, planned = mine[start : start + width], theirs[start : start + width]
            # The same batches, moved between ranks and steps inside the window...
            assert sorted(got.ravel().tolist()) == sorted(planned.ravel().tolist())
            # ...each step a run of the window's batches sorted by cost (optimal grouping).
            by_step = got[np.argsort(got.max(axis=1), kind="stable")]
            assert all(by_step[k].max() <= by_step[k + 1].min() for k in range(len(by_step) - 1)), (
                got
            )
    assert straggler_overhead(balanced) < 0.5 * straggler_overhead(plain)


def test_a_run_resumed_inside_a_window_is_the_run_read_through(data: tuple[Path, Where]) -> None:
    root, _ = data
    for workers in (0, 2):
        whole = [b["input_ids"].tolist() for b in make(root, 1, workers=workers)]
        loader = make(root, 1, workers=workers)
        first = [b["input_ids"].tolist() for b in itertools.islice(loader, WINDOW + 3)]
        state = loader.state_dict()
        again = make(root, 1, workers=workers)
        again.load_state_dict(state)
        assert first + [b["input_ids"].tolist() for b in again] == whole


def test_an_elastic_resume_at_a_windows_end_reads_every_token_once(
    data: tuple[Path, Where],
) -> None:
    root, where = data
    seen: Counter[int] = Counter()
    state = None
    for rank in range(WORLD):
        loader = make(root, rank, workers=2)
        loader.set_epoch(2)
        for batch in itertools.islice(loader, 2 * WINDOW):
            seen.update(tokens_of(batch, where, seq_len=SEQ_LEN, batch_size=BATCH))
        if rank == 0:
            state = loader.state_dict()
    assert state is not None
    counts = []
    for rank in range(2):  # 4 ranks x 2 workers -> 2 ranks in-process
        loader = make(root, rank, world=2)
        loader.load_state_dict(state)
        batches = list(loader)
        counts.append(len(batches))
        for batch in batches:
            seen.update(tokens_of(batch, where, seq_len=SEQ_LEN, batch_size=BATCH))
    assert counts[0] == counts[1]
    assert set(seen.values()) == {1} and set(seen) <= set(where)
    assert len(where) - len(seen) < (WORLD + 2) * BATCH * SEQ_LEN  # (the remainders)


def test_an_elastic_resume_inside_a_window_is_refused(data: tuple[Path, Where]) -> None:
    root, _ = data
    loader = make(root, 0)
    list(itertools.islice(loader, WINDOW + 3))
    state = loader.state_dict()
    other = make(root, 0, world=2)
    other.load_state_dict(state)
    with pytest.raises(StateMismatchError, match="inside a window of 8 steps"):
        next(iter(other))


def test_a_state_saved_without_balance_is_refused(data: tuple[Path, Where]) -> None:
    root, _ = data
    loader = make(root, 0, balance=None)
    next(iter(loader))
    with pytest.raises(StateMismatchError, match="saved with another balance"):
        make(root, 0).load_state_dict(loader.state_dict())
    balanced = make(root, 0)
    next(iter(balanced))
    saved = re.escape('another balance: fingerprint {"window": 8')
    with pytest.raises(StateMismatchError, match=saved):
        make(root, 0, balance=tdu.Balance(window=16)).load_state_dict(balanced.state_dict())


def test_rows_at_names_the_documents_of_the_batch_delivered(data: tuple[Path, Where]) -> None:
    root, where = data
    loader = make(root, 2, workers=2)
    batches = list(loader)
    for index in (0, 5, WINDOW + 1, len(batches) - 1):
        rows = loader.rows_at(index, rank=2)
        tokens = tokens_of(batches[index], where, seq_len=SEQ_LEN, batch_size=BATCH)
        documents = [where[t][0] for t in tokens]
        # The fragments' documents in order (a document's meeting fragments once), by row id.
        expected = [d for d, _ in itertools.groupby(documents)]
        table = pq.read_table(root, columns=["id"])  # (a document's id is its number)
        ids = table["id"].to_pylist()
        files = sorted(p.name for p in root.iterdir())
        named = [
            ids[files.index(Path(f).name) * 150 + r]
            for f, r in zip(rows["__file__"].to_pylist(), rows["__row__"].to_pylist(), strict=True)
        ]
        assert [d for d, _ in itertools.groupby(named)] == expected


def test_no_curriculum_over_an_epoch(tmp_path: Path) -> None:
    """The rank correlation of step and step cost over an epoch of 1,500 steps is near 0."""
    write_documents(tmp_path, 4, 3000, row_group_size=500, seed=11)
    loader = make(tmp_path, 0, world=WORLD, balance=tdu.Balance(window=64, linear=2.0))
    streams = loader.dataset.streams
    here = Topology(0, WORLD, 0, 1)
    picks = streams._worker_picks(Pass(3), here)
    costs = np.stack(
        [
            streams.costs(streams.streams.resolve(Pass(3), Topology(r, WORLD, 0, 1), done=0))
            for r in range(WORLD)
        ],
        axis=1,
    )
    per_step = costs.ravel()[picks[: len(costs)]].max(axis=1)
    assert len(per_step) > 1000
    ranks = np.argsort(np.argsort(per_step))
    rho = np.corrcoef(np.arange(len(per_step)), ranks)[0, 1]
    assert abs(rho) < 0.05
    # and the balanced steps are cheaper than the plan's
    assert per_step.sum() < costs.max(axis=1).sum()


def test_token_budget_batches_balanced_read_every_row_once(tmp_path: Path) -> None:
    write_documents(tmp_path, 3, 120, row_group_size=30)
    overheads = []
    for balance in (None, tdu.Balance(window=16, linear=1.0)):
        seen: Counter[int] = Counter()
        shapes: list[list[float]] = []
        for rank in range(WORLD):
            loader = forked(
                str(tmp_path),
                rank,
                columns=["id", "tokens"],
                batching=tdu.TokenBudget("tokens", 64, balance=balance),
            )
            mine = []
            for batch in loader:
                rows, longest = batch["tokens"].shape
                assert rows * longest <= 64
                seen.update(batch["id"].tolist())
                mine.append(float(rows * longest**2 + rows * longest))  # (its padded shape)
            assert len(mine) == len(loader)
            shapes.append(mine)
        assert len({len(s) for s in shapes}) == 1
        assert set(seen.values()) == {1} and len(seen) == 360  # every row once
        overheads.append(straggler_overhead(np.array(shapes).T))
    assert overheads[1] < 0.5 * overheads[0]


def test_a_balanced_mixture_reads_the_tokens_of_the_plain_mixture(tmp_path: Path) -> None:
    where: Where = {}
    write_documents(tmp_path / "a", 2, 100, where=where, row_group_size=20)
    write_documents(tmp_path / "b", 2, 100, where=where, first_document=200, seed=8)
    read = []
    for balance in (None, tdu.Balance(window=4)):
        seen: Counter[int] = Counter()
        counts = []
        for rank in range(WORLD):
            loader = forked(
                [tdu.Source(str(tmp_path / s), weight=1) for s in ("a", "b")],
                rank,
                packing=tdu.Packing("tokens", SEQ_LEN, pad_value=PAD, balance=balance),
                batch_size=BATCH,
            )
            batches = list(loader)
            counts.append(len(batches))
            for batch in batches:
                seen.update(tokens_of(batch, where, seq_len=SEQ_LEN, batch_size=BATCH))
        assert len(set(counts)) == 1
        # (Equal weights: some of the smaller source's tokens repeat; the remainder drops.)
        assert len(where) - len(seen) < WORLD * BATCH * SEQ_LEN
        read.append(seen)
    assert read[0] == read[1]


def test_an_eos_token_after_null_and_empty_documents_predicts_the_real_costs(
    tmp_path: Path,
) -> None:
    """With an eos_token a null list adds no token and an empty one adds one; the balancer's
    costs (from the length index) are then each batch's real cost."""
    rng = np.random.default_rng(5)
    where: Where = {}
    first = 0
    for f in range(3):
        docs = documents(rng, 80, where, first, longest=12, nulls=True)
        first += 80
        pq.write_table(token_table(docs, first_id=first - 80), tmp_path / f"p{f}.parquet")
    eos = -2
    loaders = [
        make(
            tmp_path,
            r,
            eos_token=eos,
            null_policy="fill",
            balance=tdu.Balance(window=4),
        )
        for r in range(WORLD)
    ]
    streams = loaders[0].dataset.streams
    here = [Topology(r, WORLD, 0, 1) for r in range(WORLD)]
    predicted = [streams.costs(streams.streams.resolve(Pass(0), t, done=0)) for t in here]
    picks = streams._worker_picks(Pass(0), here[0])
    for rank, loader in enumerate(loaders):
        batches = list(loader)
        flat = np.concatenate(predicted)  # (batch b of rank j at j * batches + b)
        count = len(predicted[0])
        for b, batch in enumerate(batches):
            ids = batch["input_ids"].numpy().reshape(-1)
            cu = batch["cu_seqlens"].numpy().astype(np.int64)
            lengths = np.diff(cu)[ids[cu[:-1]] != PAD].astype(np.float64)
            source = int(picks[b, rank])
            expected = flat[(source % WORLD) * count + source // WORLD]
            assert (lengths**2).sum() == expected  # (attention alone: linear 0)
