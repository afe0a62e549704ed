"""Packed sequences read for real: Parquet token lists, DataLoader workers (fork and spawn),
ranks, epochs, exact and elastic resume. Every token id is unique in the data, so the multiset
of token ids says every token was read once; each token's document and position are checked
against the data, and every rank's batch count against the others'."""

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
from tests.packed_data import tokens_of as checked_tokens
from torch_dataloader_utils.batching import Packing

pytestmark = [
    pytest.mark.timeout(300),
    pytest.mark.filterwarnings("ignore:This DataLoader will create:UserWarning"),
]

SEQ_LEN, BATCH, PAD = 8, 3, -1
FILL = 0.8  # best fit: a batch is 18 tokens of the 24 slots (3 sequences' floor(8 * 0.8))
BEST_FIT_TOKENS = BATCH * int(SEQ_LEN * FILL)


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[int, tuple[int, int]]]:
    """Three files of documents of 0-29 tokens (some null); token ids unique. Returns the folder
    and each token's (document, position)."""
    root = tmp_path_factory.mktemp("packing")
    rng = np.random.default_rng(7)
    where: dict[int, tuple[int, int]] = {}
    token = document = 0
    for f in range(3):
        documents: list[list[int] | None] = []
        for _ in range(40):
            n = int(rng.integers(0, 30))
            if n == 0 and rng.random() < 0.5:
                documents.append(None)
            else:
                documents.append(list(range(token, token + n)))
                where.update({token + p: (document, p) for p in range(n)})
                token += n
            document += 1
        table = pa.table({"tokens": pa.array(documents, pa.list_(pa.int64()))})
        pq.write_table(table, root / f"part-{f}.parquet", row_group_size=7)
    return root, where


def make(
    root: Path,
    *,
    rank: int = 0,
    world_size: int = 1,
    workers: int = 0,
    eos: int | None = None,
    method: str = "concat",
    positions: str = "fragment",
    **options: Any,
) -> Any:
    options = {"shuffle": True, "null_policy": "fill", **options}
    packing = Packing(
        "tokens",
        SEQ_LEN,
        pad_value=PAD,
        eos_token=eos,
        method=method,
        fill=FILL,
        positions=positions,
    )
    return tdu.create_dataloader(
        str(root),
        packing=packing,
        batch_size=BATCH,
        num_workers=workers,
        rank=rank,
        world_size=world_size,
        **options,
    )


def tokens_of(
    batch: dict[str, Any], where: dict[int, tuple[int, int]], positions: str = "fragment"
) -> list[int]:
    """The batch's tokens, after checking its shape, positions and boundaries."""
    return checked_tokens(batch, where, seq_len=SEQ_LEN, batch_size=BATCH, positions=positions)


TOPOLOGIES = [
    *itertools.product([1, 2, 3, 4], [0, 2], [False, True], ["concat"]),
    *itertools.product([1, 2, 3], [0, 2], [True], ["best_fit"]),
]


@pytest.mark.parametrize(("world_size", "workers", "shuffle", "method"), TOPOLOGIES)
def test_every_token_once_on_every_topology_with_equal_batches(
    data: tuple[Path, dict[int, tuple[int, int]]],
    world_size: int,
    workers: int,
    shuffle: bool,
    method: str,
) -> None:
    root, where = data
    orders = []
    for epoch in (0, 1):
        seen: Counter[int] = Counter()
        batches = []
        order: list[int] = []
        for rank in range(world_size):
            loader = make(
                root,
                rank=rank,
                world_size=world_size,
                workers=workers,
                shuffle=shuffle,
                method=method,
            )
            loader.set_epoch(epoch)
            n = short = 0
            for batch in loader:
                got = tokens_of(batch, where)
                seen.update(got)
                order += got
                n += 1
                if method == "best_fit":  # the fill of the slots; only a rank's last one less
                    assert len(got) <= BEST_FIT_TOKENS
                    short += len(got) < BEST_FIT_TOKENS or len(batch["input_ids"]) < BATCH
            assert n == len(loader) and short <= 1
            batches.append(n)
        assert len(set(batches)) == 1  # equal batches on every rank
        assert max(seen.values()) == 1  # no token twice
        assert len(where) - len(seen) < world_size  # "drop": fewer than a token per rank
        orders.append(order)
    assert (orders[0] != orders[1]) == shuffle  # a new order each epoch, when shuffled


def test_spawned_workers_read_every_token_once(
    data: tuple[Path, dict[int, tuple[int, int]]],
) -> None:
    root, where = data
    loader = make(root, workers=2, multiprocessing_context="spawn")
    seen = Counter(t for batch in loader for t in tokens_of(batch, where))
    assert seen == Counter(set(where))


@pytest.mark.parametrize(
    ("before", "after", "method"),
    [
        ((1, 0), (1, 0), "concat"),
        ((2, 2), (2, 2), "concat"),
        ((1, 0), (2, 2), "concat"),
        ((2, 2), (3, 0), "concat"),
        ((4, 1), (1, 3), "concat"),
        ((2, 2), (2, 2), "best_fit"),
        ((2, 2), (3, 0), "best_fit"),
    ],
)
def test_a_resumed_epoch_reads_every_remaining_token_once(
    data: tuple[Path, dict[int, tuple[int, int]]],
    before: tuple[int, int],
    after: tuple[int, int],
    method: str,
) -> None:
    root, where = data
    (ranks, workers), (new_ranks, new_workers) = before, after
    seen: Counter[int] = Counter()
    state = None
    # (positions in documents here, from 0 in every fragment elsewhere)
    kept = {"remainder": "pad", "method": method, "positions": "document"}
    for rank in range(ranks):
        loader = make(root, rank=rank, world_size=ranks, workers=workers, **kept)
        loader.set_epoch(1)
        for batch in itertools.islice(loader, 5):
            seen.update(tokens_of(batch, where, "document"))
        if rank == 0:
            state = loader.state_dict()
    assert state is not None
    for rank in range(new_ranks):
        loader = make(root, rank=rank, world_size=new_ranks, workers=new_workers, **kept)
        loader.load_state_dict(state)
        for batch in loader:
            seen.update(tokens_of(batch, where, "document"))
    assert set(seen) == set(where)  # every token
    # "pad" wraps to the start: only a few tokens twice, fewer than a batch per rank
    assert sum(seen.values()) - len(where) < (ranks + new_ranks) * BATCH * SEQ_LEN


def test_a_best_fit_batch_resumed_is_the_batch_read_through(
    data: tuple[Path, dict[int, tuple[int, int]]],
) -> None:
    root, _ = data
    whole = [b["input_ids"].tolist() for b in make(root, workers=2, method="best_fit")]
    loader = make(root, workers=2, method="best_fit")
    for _ in itertools.islice(loader, 5):
        pass
    state = loader.state_dict()
    loader = make(root, workers=2, method="best_fit")
    loader.load_state_dict(state)
    assert [b["input_ids"].tolist() for b in loader] == whole[5:]


def test_a_column_that_is_not_token_lists_is_refused_naming_the_source(tmp_path: Path) -> None:
    pq.write_table(pa.table({"tokens": pa.array(["a", "b"])}), tmp_path / "t.parquet")
    with pytest.raises(tdu.UnsupportedTypeError, match="'tokens' holds string, not lists of"):
        make(tmp_path, workers=0)


def test_a_null_document_under_null_policy_error_names_the_file(
    data: tuple[Path, dict[int, tuple[int, int]]],
) -> None:
    root, _ = data
    with pytest.raises(tdu.NullValueError, match=r"part-\d\.parquet"):
        for _ in make(root, workers=0, null_policy="error"):
            pass


def test_an_eos_token_ends_every_document_and_counts_in_the_plan(
    data: tuple[Path, dict[int, tuple[int, int]]],
) -> None:
    root, where = data
    lengths = Counter(d for d, _ in where.values())
    loader = make(root, workers=2, eos=-9, positions="document")
    seen: Counter[int] = Counter()
    for batch in loader:
        flat = batch["input_ids"].reshape(-1).tolist()
        positions = batch["position_ids"].reshape(-1).tolist()
        documents = batch["document_ids"].reshape(-1).tolist()
        for i, token in enumerate(flat):
            if token == -9 and i and documents[i - 1] == documents[i] and flat[i - 1] != -9:
                # right after its document's last token, at the position after it
                document, position = where[flat[i - 1]]
                assert position == lengths[document] - 1 == positions[i] - 1
        seen.update(t for t in flat if t != PAD)
    eos = seen.pop(-9)
    assert seen == Counter(set(where))
    assert len(lengths) <= eos <= 120  # every document of tokens, and empty ones not null
