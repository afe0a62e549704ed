"""Best fit (`stream.best_fit`, through `stream.packing.pack_best_fit`), by brute force over small
documents: every token placed once, whole documents where they fit, the arrangement exactly that
of a plain reference of the rule."""

from __future__ import annotations

import itertools

import numpy as np
import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.unit.stream.checks import check_positions, triples
from torch_dataloader_utils.planning.shuffle import document_permutation
from torch_dataloader_utils.stream.best_fit import place, sequences_for
from torch_dataloader_utils.stream.fragments import Fragments
from torch_dataloader_utils.stream.packing import Packed, pack_best_fit


def pieces_of(every: list[tuple[int, int, int]]) -> list[list[int]]:
    """The tokens of each document piece of a batch (a document going on at the next position
    is one piece), in batch order."""
    out: list[list[int]] = []
    for i, (token, document, position) in enumerate(every):
        _, before, at = every[i - 1] if i else (0, -1, -1)
        if (document, position) == (before, at + 1):
            out[-1].append(token)
        else:
            out.append([token])
    return out


def reference(lengths: list[int], seq_len: int, rows: int) -> list[list[tuple[int, int, int]]]:
    """Best-fit decreasing as the ADR says it, plainly: each sequence's (piece, offset, length)
    in order."""
    rooms = [seq_len] * rows
    sequences: list[list[tuple[int, int, int]]] = [[] for _ in range(rows)]
    for i in sorted(range(len(lengths)), key=lambda i: (-lengths[i], i)):
        rest, done = lengths[i], 0
        while rest:
            holding = [j for j in range(rows) if rooms[j] >= rest]
            if holding:
                j = min(holding, key=lambda j: (rooms[j], j))
            else:
                j = max(range(rows), key=lambda j: (rooms[j], -j))
            take = min(rest, rooms[j])
            sequences[j].append((i, done, take))
            rooms[j] -= take
            rest, done = rest - take, done + take
    return sequences


@settings(max_examples=300, deadline=None)
@given(
    lengths=st.lists(st.integers(1, 20), max_size=14),
    seq_len=st.integers(1, 12),
    rows=st.integers(1, 5),
)
def test_place_is_the_rule_exactly(lengths: list[int], seq_len: int, rows: int) -> None:
    while sum(lengths) > rows * seq_len:  # (the pieces of one batch fit its sequences)
        lengths = lengths[:-1]
    where = place(lengths, seq_len, rows)
    sequences: list[list[tuple[int, int, int]]] = [[] for _ in range(rows)]
    starts: list[int] = []
    for j, item, offset, length in zip(
        where.sequence, where.item, where.offset, where.length, strict=True
    ):
        starts.append(int(j) * seq_len + sum(n for _, _, n in sequences[j]))
        sequences[j].append((int(item), int(offset), int(length)))
    assert sequences == reference(lengths, seq_len, rows)
    assert where.start.tolist() == starts == sorted(starts)
    assert where.filled.tolist() == [sum(n for _, _, n in placed) for placed in sequences]


def check_boundaries(packed: Packed, seq_len: int) -> None:
    """``cu_seqlens``: from 0 to the end, a fragment at each sequence start and each change of
    document (padding one too), never across either."""
    cu = packed.cu_seqlens.tolist()
    ids = packed.document_ids.reshape(-1)
    assert cu[0] == 0 and cu[-1] == ids.size and cu == sorted(set(cu))
    changes = set((np.flatnonzero(ids[1:] != ids[:-1]) + 1).tolist())
    assert set(cu[:-1]) == changes | set(range(0, ids.size, seq_len))
    assert packed.max_seqlen == max((b - a for a, b in itertools.pairwise(cu)), default=0)


@settings(max_examples=400, deadline=None)
@given(
    lengths=st.lists(st.integers(1, 20), max_size=14),
    seq_len=st.integers(1, 12),
    batch_size=st.integers(1, 5),
    fill=st.sampled_from([0.3, 0.5, 0.8, 0.95, 1.0]),
    skip=st.integers(0, 9),
    seed=st.one_of(st.none(), st.integers(0, 9)),
    dtype=st.sampled_from([pa.int32(), pa.int64(), pa.uint16()]),
    scale=st.sampled_from([1, 70]),  # (70: parts long enough to be copied one by one)
    positions=st.sampled_from(["fragment", "document"]),
    cuts=st.lists(st.integers(0, 1500), max_size=9),
)
def test_best_fit_places_every_token_once_whole_documents_where_they_fit(
    lengths: list[int],
    seq_len: int,
    batch_size: int,
    fill: float,
    skip: int,
    seed: int | None,
    dtype: pa.DataType,
    scale: int,
    positions: str,
    cuts: list[int],
) -> None:
    """Also with the tokens in several buffers (a block's decoded parts: ``cuts``), the
    same arrays."""
    lengths, seq_len, skip = [n * scale for n in lengths], seq_len * scale, skip * scale
    docs = [list(range(20 * scale * d, 20 * scale * d + n)) for d, n in enumerate(lengths)]
    fragments = Fragments.from_lists(pa.array(docs, pa.list_(dtype)), 0)
    values = fragments.buffers[0]
    split = Fragments.of(
        tuple(np.split(values, sorted(min(c, len(values)) for c in cuts))),
        *(fragments.begin, fragments.end, fragments.document, fragments.position),
    )
    if seed is not None:
        order = document_permutation(len(fragments.begin), seed=seed, epoch=0, stream=0, block=0)
        fragments, split = fragments.permuted(order), split.permuted(order)
    budget = max(1, int(batch_size * seq_len * fill))
    batch = fragments.slice(skip, budget)  # (short when the documents run out)
    every = triples(batch)
    n = len(every)
    packed = pack_best_fit(
        batch, seq_len, batch_size, budget=budget, pad_value=-7, positions=positions
    )
    from_parts = pack_best_fit(
        split.slice(skip, budget),
        seq_len,
        batch_size,
        budget=budget,
        pad_value=-7,
        positions=positions,
    )
    for name in ("input_ids", "position_ids", "document_ids", "cu_seqlens"):
        assert np.array_equal(getattr(from_parts, name), getattr(packed, name)), name
    rows = packed.input_ids.shape[0]
    assert packed.input_ids.shape == (rows, seq_len) and packed.input_ids.dtype != np.uint16
    if n == budget:
        assert rows == batch_size  # a whole batch: its shape is fixed
    else:  # a stream's short last batch: the sequences it fills, its share at most
        assert -(-n // seq_len) <= rows <= sequences_for(n, batch_size, budget) <= batch_size
    flat = packed.input_ids.reshape(-1).tolist()
    ids = packed.document_ids.reshape(-1).tolist()
    real = [i for i, d in enumerate(ids) if d >= 0]
    # Every token once, at its position; padding at each sequence's end, and only there.
    where = {token: (document, position) for token, document, position in every}
    assert sorted(flat[i] for i in real) == sorted(where)
    check_positions(packed, [where[flat[i]][1] for i in real], positions)
    assert packed.padding == rows * seq_len - n == flat.count(-7)
    used = [sum(d >= 0 for d in row) for row in packed.document_ids.tolist()]
    for row, count in zip(packed.document_ids.tolist(), used, strict=True):
        assert all(d >= 0 for d in row[:count])
    # Empty sequences (all padding) only last, and none in a short batch.
    assert [c > 0 for c in used] == sorted((c > 0 for c in used), reverse=True)
    assert n == budget or all(used)
    check_boundaries(packed, seq_len)
    # A batch-local id is one piece of one document, its parts in order.
    pieces = pieces_of(every)
    for i in real:
        assert flat[i] in pieces[ids[i]]
    # The arrangement is the rule's, exactly.
    sequences = reference([len(p) for p in pieces], seq_len, rows)
    for row, placed in zip(packed.input_ids.tolist(), sequences, strict=True):
        expect = [t for i, at, length in placed for t in pieces[i][at : at + length]]
        assert row == expect + [-7] * (seq_len - len(expect))
    # Whole where it fits: a piece L <= seq_len is split only if every sequence had less than L
    # room when its turn came, so at least rows * (seq_len - L + 1) tokens went before it.
    for i, piece in enumerate(pieces):
        if len(piece) <= seq_len and n - len(piece) < rows * (seq_len - len(piece) + 1):
            assert len({r for r, row in enumerate(packed.document_ids.tolist()) if i in row}) == 1


def test_best_fit_keeps_documents_whole_where_concat_cuts_them() -> None:
    docs = [list(range(10 * d, 10 * d + n)) for d, n in enumerate([6, 5, 4, 3, 2])]
    batch = Fragments.from_lists(pa.array(docs, pa.list_(pa.int64())), 0)
    packed = pack_best_fit(batch, 8, 3, budget=20, pad_value=-1)
    assert packed.input_ids.tolist() == [
        [0, 1, 2, 3, 4, 5, 40, 41],
        [10, 11, 12, 13, 14, 30, 31, 32],
        [20, 21, 22, 23, -1, -1, -1, -1],
    ]
    assert packed.cu_seqlens.tolist() == [0, 6, 8, 13, 16, 20, 24]
    assert packed.document_ids.tolist()[2] == [2, 2, 2, 2, -1, -1, -1, -1]
    assert packed.max_seqlen == 6 and packed.padding == 4


def test_best_fit_splits_a_long_document_and_its_positions_go_on() -> None:
    batch = Fragments.from_lists(pa.array([list(range(11)), [50, 51]], pa.list_(pa.int64())), 0)
    cut = batch.slice(2)  # (from 2)
    packed = pack_best_fit(cut, 4, 3, budget=11, pad_value=-1, positions="document")
    assert packed.input_ids.tolist() == [[2, 3, 4, 5], [6, 7, 8, 9], [10, 50, 51, -1]]
    assert packed.position_ids.tolist() == [[2, 3, 4, 5], [6, 7, 8, 9], [10, 0, 1, 0]]
    fragment = pack_best_fit(cut, 4, 3, budget=11, pad_value=-1)  # (the default)
    assert fragment.position_ids.tolist() == [[0, 1, 2, 3], [0, 1, 2, 3], [0, 0, 1, 0]]
    assert packed.document_ids.tolist() == [[0, 0, 0, 0], [0, 0, 0, 0], [0, 1, 1, -1]]
    assert packed.cu_seqlens.tolist() == [0, 4, 8, 9, 11, 12]


def test_best_fit_takes_a_documents_fragments_that_go_on_as_one_piece() -> None:
    values = np.array([5, 6, 7, 1, 2, 3])
    zero = np.zeros(2, np.int64)
    # Document 0's tokens 0-2 sit after its tokens 3-5 in the buffer.
    batch = Fragments.of(values, np.array([3, 0]), np.array([6, 3]), zero, np.array([0, 3]))
    packed = pack_best_fit(batch, 6, 2, budget=12)
    assert packed.input_ids.tolist() == [[1, 2, 3, 5, 6, 7]]  # (short: one sequence of two)
    assert packed.position_ids.tolist() == [[0, 1, 2, 3, 4, 5]]
    assert packed.document_ids.tolist() == [[0] * 6] and packed.cu_seqlens.tolist() == [0, 6]
