"""A packed mixture read for real: two Parquet sources of token lists, interleaved a sequence
at a time, over ranks and DataLoader workers, resumed exactly and elastically. Token ids are
unique across both sources, so the multiset of token ids says which tokens were read and how
often; each token's document, position and source are checked against the data."""

from __future__ import annotations

import itertools
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import torch_dataloader_utils as tdu

pytestmark = [
    pytest.mark.timeout(300),
    pytest.mark.filterwarnings("ignore:This DataLoader will create:UserWarning"),
]

SEQ_LEN, BATCH, PAD = 8, 2, -1
Where = dict[int, tuple[int, int, int]]  # token -> (source, document, position)


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> tuple[list[Path], Where]:
    """Two sources (the second about half the first) of documents of 1-20 tokens; token ids
    and document numbers unique across both."""
    rng = np.random.default_rng(11)
    where: Where = {}
    token = document = 0
    roots = []
    for source, files in enumerate((3, 2)):
        root = tmp_path_factory.mktemp(f"source{source}")
        for f in range(files):
            documents = []
            for _ in range(25):
                n = int(rng.integers(1, 21))
                documents.append(list(range(token, token + n)))
                where.update({token + p: (source, document, p) for p in range(n)})
                token += n
                document += 1
            table = pa.table({"tokens": pa.array(documents, pa.list_(pa.int64()))})
            pq.write_table(table, root / f"part-{f}.parquet", row_group_size=6)
        roots.append(root)
    return roots, where


def make(roots: list[Path], method: str = "concat", **options: Any) -> Any:
    weights = options.pop("weights", (None, None))
    options = {"shuffle": True, "batch_size": BATCH, "source_column": "source", **options}
    return tdu.create_dataloader(
        [tdu.Source(str(r), weight=w) for r, w in zip(roots, weights, strict=True)],
        packing=tdu.Packing("tokens", seq_len=SEQ_LEN, pad_value=PAD, method=method, fill=0.8),
        **options,
    )


def tokens_of(batch: dict[str, Any], where: Where, *, whole: bool = True) -> list[int]:
    """The batch's tokens, after checking that each fragment holds one document's, in order,
    at positions from 0 (padding too), and (``whole``: concatenated) that each sequence holds
    one source's."""
    flat = batch["input_ids"].reshape(-1).tolist()
    positions = batch["position_ids"].reshape(-1).tolist()
    sources = batch["source"].reshape(-1).tolist()
    cu = batch["cu_seqlens"].tolist()
    assert cu[0] == 0 and cu[-1] == len(flat) and cu == sorted(set(cu))
    for s in range(0, len(flat), SEQ_LEN):
        real = [t for t in flat[s : s + SEQ_LEN] if t != PAD]
        assert not whole or len({where[t][0] for t in real}) <= 1  # one source's sequence
    for a, b in itertools.pairwise(cu):
        assert positions[a:b] == list(range(b - a))
        fragment = [(t, i) for i, t in enumerate(flat[a:b], start=a) if t != PAD]
        if fragment:
            assert len({where[t][1] for t, _ in fragment}) == 1
            assert [where[t][2] for t, _ in fragment] == list(
                range(where[fragment[0][0]][2], where[fragment[0][0]][2] + len(fragment))
            )  # one document's tokens, in order
            for t, i in fragment:
                assert where[t][0] == sources[i]
    return [t for t in flat if t != PAD]


# (4 and 5 ranks do not divide the data's 162 sequences: a rank once began inside one)
@pytest.mark.parametrize(
    ("world_size", "workers", "mixing", "method"),
    [
        *itertools.product([1, 2], [0, 2], ["random", "stratified"], ["concat"]),
        (3, 2, "random", "concat"),
        (2, 2, "stratified", "best_fit"),
        (4, 2, "random", "concat"),
        (5, 0, "stratified", "concat"),
    ],
)
def test_every_source_delivers_its_quota_of_tokens_once_with_equal_batches(
    data: tuple[list[Path], Where], world_size: int, workers: int, mixing: str, method: str
) -> None:
    roots, where = data
    unit = SEQ_LEN if method == "concat" else int(SEQ_LEN * 0.8)
    tokens = [sum(1 for s, _, _ in where.values() if s == i) for i in (0, 1)]
    for epoch in (0, 1):
        seen: Counter[int] = Counter()
        batches = []
        for rank in range(world_size):
            loader = make(
                roots,
                method,
                rank=rank,
                world_size=world_size,
                num_workers=workers,
                mixing=mixing,
            )
            quotas = loader.dataset.quotas
            loader.set_epoch(epoch)
            got = [tokens_of(b, where, whole=method == "concat") for b in loader]
            assert len(got) == len(loader)
            batches.append(len(got))
            seen.update(t for b in got for t in b)
        assert len(set(batches)) == 1  # equal batches on every rank
        # Each source: its tokens rounded down to whole sequences, read once; the rest of a
        # source's pass opens its next epoch, which then goes on into the next pass (fewer
        # than a sequence's tokens of each source may meet again there).
        twice = sum(c - 1 for c in seen.values())
        assert twice == 0 if epoch == 0 else twice < 2 * SEQ_LEN
        assert list(quotas) == [t // unit * unit for t in tokens]
        per_source = Counter(where[t][0] for t in seen)
        short = world_size * BATCH * unit  # "drop": less than a batch per rank
        for i in (0, 1):
            assert quotas[i] - short < per_source[i] <= quotas[i]


def test_weights_share_the_tokens_and_each_source_goes_on_where_it_stopped(
    data: tuple[list[Path], Where],
) -> None:
    roots, where = data
    loader = make(roots, weights=(1, 3), epoch_rows=160, num_workers=2, remainder="pad")
    assert list(loader.dataset.quotas) == [40, 120]
    seen: Counter[int] = Counter()
    for epoch in (0, 1):
        loader.set_epoch(epoch)
        got = [t for b in loader for t in tokens_of(b, where)]
        assert Counter(where[t][0] for t in got) == {0: 40, 1: 120}
        seen.update(got)
    # Each source goes on where it stopped (both hold more than two epochs' quota).
    assert max(seen.values()) == 1


@pytest.mark.parametrize(
    ("before", "after"),
    [((1, 0), (1, 0)), ((1, 2), (2, 0)), ((2, 0), (1, 2)), ((2, 2), (4, 0))],
)
def test_a_resumed_packed_mixture_reads_every_remaining_token_once(
    data: tuple[list[Path], Where], before: tuple[int, int], after: tuple[int, int]
) -> None:
    roots, where = data
    (ranks, workers), (new_ranks, new_workers) = before, after
    expected: Counter[int] = Counter()
    for rank in range(ranks):
        loader = make(roots, rank=rank, world_size=ranks, num_workers=workers)
        loader.set_epoch(1)
        expected.update(t for b in loader for t in tokens_of(b, where))
    seen: Counter[int] = Counter()
    state = None
    for rank in range(ranks):
        loader = make(roots, rank=rank, world_size=ranks, num_workers=workers)
        loader.set_epoch(1)
        for batch in itertools.islice(loader, 3):
            seen.update(tokens_of(batch, where))
        if rank == 0:
            state = loader.state_dict()
    assert state is not None
    for rank in range(new_ranks):
        loader = make(roots, rank=rank, world_size=new_ranks, num_workers=new_workers)
        loader.load_state_dict(state)
        seen.update(t for b in loader for t in tokens_of(b, where))
    # No token more often than in the epoch read whole (where a source's next pass may meet
    # its last), and the same tokens, give or take the last batch of each rank ("drop" cuts
    # at the new topology's batches).
    assert all(c <= expected[t] for t, c in seen.items())
    assert len(set(expected) ^ set(seen)) < (ranks + new_ranks) * BATCH * SEQ_LEN
