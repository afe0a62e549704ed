"""Row shuffling inside a stream: block boundaries, per-block permutations, and `BlockOrder`,
the one value every caller draws them through."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from torch_dataloader_utils.errors import InvalidArgumentError
from torch_dataloader_utils.planning import Layout, block_bounds, block_of, block_permutation
from torch_dataloader_utils.planning.sequence import DocumentRest
from torch_dataloader_utils.planning.shuffle import BlockOrder, document_permutation


def check_bounds(length: int, block_rows: int, first_block_rows: int) -> None:
    bounds = block_bounds(length, block_rows=block_rows, first_block_rows=first_block_rows)
    ctx = (length, block_rows, first_block_rows, bounds)
    if length == 0:
        assert bounds == [], ctx
        return
    # Contiguous, covering [0, length), none empty.
    assert bounds[0][0] == 0, ctx
    assert bounds[-1][1] == length, ctx
    assert all(a[1] == b[0] for a, b in itertools.pairwise(bounds)), ctx
    sizes = [stop - start for start, stop in bounds]
    assert all(size > 0 for size in sizes), ctx
    # A ramp: the first block has first_block_rows (at least one row, at most block_rows), each
    # next one twice the last, up to block_rows; only the last block may fall short.
    first = max(1, min(first_block_rows, block_rows))
    ramp = [min(first * 2**i, block_rows) for i in range(len(sizes))]
    assert sizes[:-1] == ramp[:-1], ctx
    assert sizes[-1] <= ramp[-1], ctx


def test_block_bounds_ramp_up_and_cover_the_stream():
    for length, block_rows, first_block_rows in itertools.product(
        range(41), range(1, 10), range(11)
    ):
        check_bounds(length, block_rows, first_block_rows)


@pytest.mark.parametrize(
    ("length", "block_rows", "first_block_rows", "expected"),
    [
        (0, 8, 1, []),
        (1, 8, 1, [(0, 1)]),
        (20, 8, 1, [(0, 1), (1, 3), (3, 7), (7, 15), (15, 20)]),
        (20, 8, 8, [(0, 8), (8, 16), (16, 20)]),
        (20, 8, 100, [(0, 8), (8, 16), (16, 20)]),
        (10, 4, 3, [(0, 3), (3, 7), (7, 10)]),
        (3, 8, 0, [(0, 1), (1, 3)]),
    ],
)
def test_block_bounds_examples(length, block_rows, first_block_rows, expected):
    got = block_bounds(length, block_rows=block_rows, first_block_rows=first_block_rows)
    assert got == expected


@given(
    length=st.integers(0, 20_000),
    block_rows=st.integers(1, 600),
    first_block_rows=st.integers(0, 700),
)
@settings(max_examples=200, deadline=None)
def test_block_bounds_property(length, block_rows, first_block_rows):
    check_bounds(length, block_rows, first_block_rows)


@pytest.mark.timeout(0.5, method="signal")
@pytest.mark.parametrize("block_rows", [0, -1])
def test_block_bounds_rejects_a_block_size_below_one(block_rows):
    with pytest.raises(InvalidArgumentError):
        block_bounds(5, block_rows=block_rows, first_block_rows=1)


def test_block_permutation_is_a_deterministic_permutation():
    for n, seed, epoch, stream, block in itertools.product(
        range(17), (0, 5), range(2), range(3), range(3)
    ):
        perm = block_permutation(seed=seed, epoch=epoch, stream=stream, block=block, n=n)
        assert sorted(perm.tolist()) == list(range(n))
        again = block_permutation(seed=seed, epoch=epoch, stream=stream, block=block, n=n)
        assert perm.tolist() == again.tolist()


def test_block_permutation_differs_by_seed_epoch_stream_and_block():
    keys = list(itertools.product(range(3), range(3), range(4), range(4)))
    perms = {
        tuple(block_permutation(seed=s, epoch=e, stream=st_, block=b, n=20).tolist())
        for s, e, st_, b in keys
    }
    # 144 keys, 20! permutations: any collision means a key is ignored or keys alias each other
    # (e.g. stream 1 block 0 and stream 0 block 1).
    assert len(perms) == len(keys)


def test_block_permutation_of_one_key_does_not_depend_on_other_keys_being_drawn():
    first = block_permutation(seed=3, epoch=1, stream=2, block=5, n=50).tolist()
    for b in range(5):
        block_permutation(seed=3, epoch=1, stream=2, block=b, n=50)
    assert block_permutation(seed=3, epoch=1, stream=2, block=5, n=50).tolist() == first


def test_block_permutation_moves_rows():
    # A permutation of a large block that is the identity would be no shuffle at all.
    perm = block_permutation(seed=0, epoch=0, stream=0, block=0, n=1000).tolist()
    fixed = sum(i == p for i, p in enumerate(perm))
    assert fixed < 20


@settings(max_examples=300, deadline=None)
@given(
    length=st.integers(1, 5000),
    block_rows=st.integers(1, 700),
    first_block_rows=st.integers(1, 900),
    data=st.data(),
)
def test_block_of_finds_the_block_block_bounds_lists(
    length: int, block_rows: int, first_block_rows: int, data: st.DataObject
) -> None:
    bounds = block_bounds(length, block_rows=block_rows, first_block_rows=first_block_rows)
    position = data.draw(st.integers(0, length - 1))
    index = next(i for i, (a, b) in enumerate(bounds) if a <= position < b)
    got = block_of(position, length, block_rows=block_rows, first_block_rows=first_block_rows)
    assert got == (index, *bounds[index])


# --- BlockOrder: a stream's blocks and their permutations, as one value -----------------------


def layout(
    *, shuffle: bool = True, block_rows: int = 8, first: int = 2, seq_tokens: int = 0
) -> Layout:
    return Layout(4, shuffle, 11, False, "drop", block_rows, first, seq_tokens=seq_tokens)


@pytest.mark.parametrize(("leg", "source"), [(0, None), (2, None), (0, 1), (3, 4)])
def test_block_order_draws_the_keyed_permutations(leg: int, source: int | None) -> None:
    """Its key is the seed, epoch, stream, leg and source (and the block): the permutations
    are exactly those of `block_permutation` and `document_permutation` under it."""
    order = BlockOrder(layout(), 50, epoch=3, stream=5, leg=leg, source=source)
    key = {"seed": 11, "epoch": 3, "stream": 5, "leg": leg, "source": source}
    for block, n in [(0, 2), (1, 4), (4, 8), (6, 3)]:
        rows = block_permutation(block=block, n=n, **key)  # type: ignore[arg-type]
        assert order.permutation(block, n).tolist() == rows.tolist()
        documents = document_permutation(n + 5, block=block, **key)  # type: ignore[arg-type]
        assert order.documents(block, n + 5).tolist() == documents.tolist()


def test_block_orders_of_other_legs_and_sources_differ() -> None:
    orders = [
        BlockOrder(layout(), 64, epoch=1, stream=2, leg=leg, source=source)
        for leg in range(3)
        for source in (None, 0, 1)
    ]
    assert len({tuple(o.permutation(3, 8).tolist()) for o in orders}) == len(orders)
    assert len({tuple(o.documents(3, 8).tolist()) for o in orders}) == len(orders)


@settings(max_examples=200, deadline=None)
@given(
    length=st.integers(0, 3000),
    block_rows=st.integers(1, 300),
    first=st.integers(0, 400),
    position=st.integers(0, 2999),
)
def test_block_order_bounds_are_the_layouts(
    length: int, block_rows: int, first: int, position: int
) -> None:
    order = BlockOrder(layout(block_rows=block_rows, first=first), length, epoch=0, stream=0)
    assert order.bounds() == block_bounds(length, block_rows=block_rows, first_block_rows=first)
    if position < length:
        got = block_of(position, length, block_rows=block_rows, first_block_rows=first)
        assert order.block_of(position) == got


def delivered_by_hand(order: BlockOrder) -> np.ndarray:
    """The stream's rows in the order it delivers them: each block's, permuted."""
    return np.concatenate(
        [[], *(a + order.permutation(i, b - a) for i, (a, b) in enumerate(order.bounds()))]
    ).astype(np.int64)


@settings(max_examples=200, deadline=None)
@given(
    length=st.integers(0, 400),
    block_rows=st.integers(1, 40),
    first=st.integers(0, 50),
    leg=st.integers(0, 2),
    source=st.sampled_from([None, 0, 3]),
    data=st.data(),
)
def test_delivered_maps_offsets_through_their_blocks_permutations(
    length: int, block_rows: int, first: int, leg: int, source: int | None, data: st.DataObject
) -> None:
    """Any offsets, in any order and repeated: the rows delivered at them."""
    order = BlockOrder(layout(block_rows=block_rows, first=first), length, 2, 7, leg, source)
    whole = delivered_by_hand(order)
    assert sorted(whole.tolist()) == list(range(length))
    assert order.delivered(np.arange(length)).tolist() == whole.tolist()
    if length:
        picks = data.draw(st.lists(st.integers(0, length - 1), max_size=60))
        offsets = np.asarray(picks, dtype=np.int64)
        assert order.delivered(offsets).tolist() == whole[offsets].tolist()


def test_delivered_without_shuffling_is_the_offsets() -> None:
    order = BlockOrder(layout(shuffle=False), 30, epoch=0, stream=1)
    offsets = np.asarray([5, 1, 29, 1])
    assert order.delivered(offsets).tolist() == [5, 1, 29, 1]
    assert order.delivered(np.zeros(0, np.int64)).tolist() == []


def test_delivered_refuses_a_packed_stream() -> None:
    """A packed stream's blocks move by documents, whose lengths only the data tells."""
    order = BlockOrder(layout(seq_tokens=16), 30, epoch=0, stream=1)
    with pytest.raises(TypeError, match="documents"):
        order.delivered(np.arange(3))


def test_a_document_rest_draws_its_blocks_order_through_its_block_order() -> None:
    """What an earlier leg left of a packed block: drawn with the key of its block, leg and
    source, as `document_permutation` draws it."""
    for source in (None, 2):
        order = BlockOrder(layout(seq_tokens=16), 90, epoch=4, stream=3, leg=1, source=source)
        rest = DocumentRest(order, 5, 10, 0, 20, ((0, 40),))
        assert rest.permutation(13).tolist() == order.documents(5, 13).tolist()
        key = {"seed": 11, "epoch": 4, "stream": 3, "block": 5, "leg": 1}
        again = document_permutation(13, **key, **({} if source is None else {"source": source}))
        assert again.tolist() == order.documents(5, 13).tolist()
