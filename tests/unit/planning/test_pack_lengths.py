"""`planning.pack_lengths.batch_fragments` against real packed batches: for every batch of
every stream of every rank, the predicted fragment lengths are the batch's own ``cu_seqlens``
diffs (its padding left out), computed from the plan and a length index alone."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import torch_dataloader_utils as tdu
from torch_dataloader_utils.errors import InvalidArgumentError
from torch_dataloader_utils.planning.balance import batch_costs
from torch_dataloader_utils.planning.pack_lengths import (
    DocumentIndex,
    batch_fragments,
    batch_pieces,
    document_tokens,
)
from torch_dataloader_utils.planning.resume import Pass
from torch_dataloader_utils.planning.topology import Topology
from torch_dataloader_utils.stream.best_fit_lengths import best_fit_fragments

SEQ_LEN, BATCH, PAD, EOS, WORLD = 16, 3, -1, -2, 2


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Four Parquet files (one of two row groups) of list<int32> documents: empty and null
    ones, one longer than two sequences; every token id unique and non-negative."""
    root = tmp_path_factory.mktemp("pack_lengths")
    rng = np.random.default_rng(3)
    token = 0
    for f in range(4):
        docs: list[list[int] | None] = []
        for i in range(70 + 9 * f):
            n = int(rng.integers(0, 30))
            if f == 1 and i == 5:
                n = 41  # (longer than two sequences)
            if n == 0 and i % 2:
                docs.append(None)
                continue
            docs.append(list(range(token, token + n)))
            token += n
        table = pa.table({"tokens": pa.array(docs, pa.list_(pa.int32()))})
        pq.write_table(table, root / f"part-{f}.parquet", row_group_size=40 if f == 2 else 1000)
    return root


def _index(dataset: object) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Each row's list length and validity in plan order (read here), and each chunk's rows."""
    return _index_of(dataset.sources[0].plan)  # type: ignore[attr-defined]


def _index_of(plan: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    lengths, present = [], []
    for chunk in plan.chunks:
        read = pq.ParquetFile(chunk.path).read_row_groups(range(chunk.start, chunk.stop))
        column = read.column("tokens").combine_chunks()
        lengths.append(np.nan_to_num(column.value_lengths().to_numpy(zero_copy_only=False)))
        present.append(column.is_valid().to_numpy(zero_copy_only=False))
    chunk_rows = np.asarray(plan.chunk_rows, dtype=np.int64)
    return np.concatenate(lengths).astype(np.int64), np.concatenate(present), chunk_rows


def _loader(
    data: Path, rank: int, workers: int, eos: int | None, *, packed: object = None, **kw: object
) -> object:
    packing = {} if packed is None else packed
    return tdu.create_dataloader(
        str(data),
        format="parquet",
        packing=tdu.Packing("tokens", SEQ_LEN, pad_value=PAD, eos_token=eos, **packing),
        batch_size=BATCH,
        shuffle=True,
        shuffle_block_size=40,  # (tokens: many blocks, cut inside batches and documents)
        num_workers=workers,
        rank=rank,
        world_size=WORLD,
        null_policy="fill",  # (a null document is an empty one)
        timeout=60,
        multiprocessing_context="fork" if workers else None,
        **kw,
    )


def _real(batch: dict[str, object]) -> tuple[np.ndarray, np.ndarray]:
    """A batch's fragment lengths (its ``cu_seqlens`` diffs, the padding ones left out: a
    fragment of padding starts with ``PAD``, no token is negative but EOS) and its tokens."""
    ids = batch["input_ids"].numpy().reshape(-1)  # type: ignore[attr-defined]
    cu = batch["cu_seqlens"].numpy().astype(np.int64)  # type: ignore[attr-defined]
    assert cu[0] == 0 and cu[-1] == len(ids)
    real = ids[cu[:-1]] != PAD
    return np.diff(cu)[real], ids[ids != PAD]


def _predict(stream: object, index: object, packed: dict[str, object] | None) -> object:
    if packed is not None and packed.get("method") == "best_fit":
        return best_fit_fragments(stream, index, seq_len=SEQ_LEN, batch_size=BATCH)  # type: ignore[arg-type]
    return batch_fragments(stream, index, seq_len=SEQ_LEN)  # type: ignore[arg-type]


def _check_epoch(
    loaders: list[object], epoch: int, index: object, workers: int, packed: dict[str, object] | None
) -> tuple[np.ndarray, int, np.ndarray]:
    """Every real batch of every rank against its prediction, and the balancer's costs of
    both; the tokens read, the predicted tokens, and rank 0's predicted lengths."""
    read: list[np.ndarray] = []
    predicted_total = 0
    first: list[np.ndarray] = []
    for rank, loader in enumerate(loaders):
        loader.set_epoch(epoch)  # type: ignore[attr-defined]
        streams = loader.dataset.streams  # type: ignore[attr-defined]
        nw = max(workers, 1)
        predicted = [
            _predict(streams.resolve(Pass(epoch), Topology(rank, WORLD, w, nw)), index, packed)
            for w in range(nw)
        ]
        order = _delivery([len(offsets) - 1 for _, offsets in predicted])  # type: ignore[attr-defined]
        batches = list(loader)  # type: ignore[call-overload]
        assert len(batches) == len(order) == len(loader)  # type: ignore[arg-type]
        real_lengths, expect_lengths = [], []
        for batch, (w, b) in zip(batches, order, strict=True):
            fragments, ids = _real(batch)
            frag, offsets = predicted[w]  # type: ignore[misc]
            expected = frag[offsets[b] : offsets[b + 1]]
            np.testing.assert_array_equal(fragments, expected)
            real_lengths.append(fragments)
            expect_lengths.append(expected)
            read.append(ids)
            predicted_total += int(expected.sum())
        # The balancer's costs from the prediction are the real batches' costs.
        offsets_real = np.cumsum([0] + [len(x) for x in real_lengths])
        for cost in ("tokens", "attention"):
            np.testing.assert_array_equal(
                batch_costs(np.concatenate(expect_lengths), offsets_real, cost, linear=3.0),
                batch_costs(np.concatenate(real_lengths), offsets_real, cost, linear=3.0),
            )
        if rank == 0:
            first.append(np.concatenate(expect_lengths))
    return np.concatenate(read), predicted_total, first[0]


def _delivery(counts: list[int]) -> list[tuple[int, int]]:
    """(worker, its batch) in DataLoader order: workers in turn, the exhausted ones skipped."""
    return [(w, b) for b in range(max(counts)) for w in range(len(counts)) if b < counts[w]]


@pytest.mark.parametrize(
    ("workers", "eos", "remainder", "packed"),
    [
        pytest.param(0, None, "drop", None, id="concat"),
        pytest.param(2, EOS, "drop", None, id="concat-eos-workers"),
        pytest.param(
            0, EOS, "pad", {"static_shape": True, "positions": "document"}, id="concat-eos-pad"
        ),
        pytest.param(2, None, "drop", {"method": "best_fit", "fill": 0.8}, id="best_fit-workers"),
        pytest.param(2, None, "drop_last", None, id="concat-drop_last"),
        pytest.param(
            0,
            EOS,
            "drop",
            {"method": "best_fit", "fill": 0.9, "static_shape": True},
            id="best_fit-eos-static",
        ),
    ],
)
def test_predicted_fragments_are_every_batch_cu_seqlens(
    data: Path, workers: int, eos: int | None, remainder: str, packed: dict[str, object] | None
) -> None:
    # ("drop_last": each rank's span trimmed to whole batches; the remainder "drop")
    options = {"drop_last": True} if remainder == "drop_last" else {"remainder": remainder}
    loaders = [_loader(data, r, workers, eos, packed=packed, **options) for r in range(WORLD)]
    lengths, present, chunk_rows = _index(loaders[0].dataset)  # type: ignore[attr-defined]
    tokens = document_tokens(lengths, present, eos=eos is not None)
    index = DocumentIndex.of(tokens, chunk_rows)
    total_data = int(lengths[present].sum())
    orders: list[np.ndarray] = []
    for epoch in (0, 1):
        ids, predicted_total, lengths_0 = _check_epoch(loaders, epoch, index, workers, packed)
        orders.append(lengths_0)
        assert len(ids) == predicted_total
        data_ids = ids[ids >= 0]
        assert (ids[ids < 0] == EOS).all()
        assert set(data_ids.tolist()) <= set(range(total_data))
        if remainder == "drop_last":  # every token at most once, whole batches
            assert len(np.unique(data_ids)) == len(data_ids)
            assert predicted_total % (BATCH * SEQ_LEN) == 0
        elif remainder == "drop":  # every token at most once; fewer than WORLD dropped
            assert len(np.unique(data_ids)) == len(data_ids)
            assert int(tokens.sum()) - predicted_total < WORLD  # (the ranks' equal spans)
        else:  # padding by wrapping: every token at least once
            assert len(np.unique(data_ids)) == total_data
    # Two epochs, two shuffles: the prediction follows the epoch.
    assert not np.array_equal(orders[0], orders[1])


def test_planning_length_index_is_the_read_one(data: Path) -> None:
    """A token budget's planning-time length index (`PlannedSource.row_lengths`, a null list's
    length -1) is the index the prediction takes, read from the data here, and over the same
    chunks."""
    budget = tdu.create_dataloader(
        str(data), format="parquet", batching=tdu.TokenBudget("tokens", max_tokens=64)
    )
    packed = _loader(data, 0, 0, None)
    lengths, present, chunk_rows = _index(packed.dataset)  # type: ignore[attr-defined]
    source = budget.dataset.sources[0]  # type: ignore[attr-defined]
    assert list(source.plan.chunks) == list(packed.dataset.sources[0].plan.chunks)  # type: ignore[attr-defined]
    np.testing.assert_array_equal(source.row_lengths, np.where(present, lengths, -1))
    np.testing.assert_array_equal(source.plan.chunk_rows, chunk_rows)
    # (An index of one int32 a row tells a null list from an empty one by a negative length.)
    marked = np.where(present, lengths, -1)
    for eos in (False, True):
        np.testing.assert_array_equal(
            document_tokens(marked, eos=eos), document_tokens(lengths, present, eos=eos)
        )


def test_refused(data: Path) -> None:
    """Best fit, a wrong seq_len and a length index that does not add up are refused."""
    loader = _loader(data, 0, 0, None)
    lengths, present, chunk_rows = _index(loader.dataset)  # type: ignore[attr-defined]
    index = DocumentIndex.of(document_tokens(lengths, present), chunk_rows)
    stream = loader.dataset.streams.resolve(Pass(0), Topology(0, WORLD))  # type: ignore[attr-defined]
    with pytest.raises(InvalidArgumentError, match="concatenation"):
        batch_fragments(stream, index, seq_len=SEQ_LEN, method="best_fit")
    with pytest.raises(InvalidArgumentError, match="seq_len"):
        batch_fragments(stream, index, seq_len=SEQ_LEN * 2)
    with_eos = DocumentIndex.of(document_tokens(lengths, present, eos=True), chunk_rows)
    with pytest.raises(InvalidArgumentError, match="length index"):
        batch_fragments(stream, with_eos, seq_len=SEQ_LEN)  # (a loader without eos_token)
    with pytest.raises(InvalidArgumentError, match="documents"):
        DocumentIndex.of(index.tokens[1:], chunk_rows)


@pytest.mark.parametrize(
    ("workers", "packed", "mixing"),
    [
        pytest.param(2, None, "stratified", id="concat-workers"),
        pytest.param(0, {"method": "best_fit", "fill": 0.8}, "random", id="best_fit"),
    ],
)
def test_mixture(data: Path, workers: int, packed: dict[str, object] | None, mixing: str) -> None:
    """A packed mixture's streams (each sequence one source's tokens, sources interleaved by
    sequences): predicted from each source's length index."""
    roots = [data / "a", data / "b"]
    for root, parts in zip(roots, ((0, 1), (2, 3)), strict=True):
        root.mkdir(exist_ok=True)
        for f in parts:
            if not (root / f"part-{f}.parquet").exists():
                (root / f"part-{f}.parquet").hardlink_to(data / f"part-{f}.parquet")
    loaders = [
        tdu.create_dataloader(
            [tdu.Source(str(roots[0]), weight=1), tdu.Source(str(roots[1]), weight=2)],
            packing=tdu.Packing("tokens", SEQ_LEN, pad_value=PAD, eos_token=EOS, **(packed or {})),
            batch_size=BATCH,
            shuffle=True,
            shuffle_block_size=40,
            mixing=mixing,
            null_policy="fill",
            num_workers=workers,
            rank=r,
            world_size=WORLD,
            timeout=60,
            multiprocessing_context="fork" if workers else None,
        )
        for r in range(WORLD)
    ]
    dataset = loaders[0].dataset
    indexes = []
    for source in dataset.sources:
        lengths, present, chunk_rows = _index_of(source.plan)
        indexes.append(DocumentIndex.of(document_tokens(lengths, present, eos=True), chunk_rows))
    for epoch in (0, 1):
        ids, predicted_total, _ = _check_epoch(loaders, epoch, indexes, workers, packed)
        assert len(ids) == predicted_total
    with pytest.raises(InvalidArgumentError, match="each of the 2 sources"):
        batch_pieces(dataset.streams.resolve(Pass(0), Topology(0, WORLD)), indexes[0])
