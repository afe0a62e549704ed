"""Rows of list columns gathered end to end or padded: every strategy (slices, one gather,
windows) gives each row's list, checked against plain Python over narrow and wide rows; from
one array of values or from the parts of a block (`ListParts`), alike."""

from __future__ import annotations

import itertools

import numpy as np
import pyarrow as pa
import pytest

from torch_dataloader_utils.convert import Converter
from torch_dataloader_utils.convert.arrow_values import Picks
from torch_dataloader_utils.convert.lists import gather_rows, list_parts, pad_rows


def _lists(seed: int, rows: int, low: int, high: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    lengths = rng.integers(low, high + 1, rows)
    offsets = np.concatenate([[0], np.cumsum(lengths)])
    return rng.integers(-1000, 1000, int(offsets[-1])).astype(np.int32), offsets


# (low, high) list lengths: narrow rows (one gather, windows) and wide ones (slices, a row at
# a time), empty rows among them.
SHAPES = [(0, 3), (0, 40), (60, 70), (100, 200), (0, 500), (32, 992)]


@pytest.mark.parametrize(("low", "high"), SHAPES)
@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("last", [True, False], ids=["last-list", "inner-lists"])
def test_each_row_laid_end_to_end_and_padded(low: int, high: int, seed: int, last: bool) -> None:
    values, offsets = _lists(seed, 300, low, high)
    # The last lists (too near the end of the values for a full window) taken or not: padded
    # rows come from windows of the values either way, those rows one at a time.
    rows = np.random.default_rng(seed + 9).permutation(300 if last else 250)[:200]
    if last:
        rows[0] = 299
    starts = offsets[rows].astype(np.int64)
    lengths = offsets[rows + 1].astype(np.int64) - starts
    expected = [values[a : a + m].tolist() for a, m in zip(starts, lengths, strict=True)]
    laid = gather_rows(values, starts, lengths)
    assert laid.dtype == values.dtype
    assert laid.tolist() == [v for row in expected for v in row]
    width = max(len(row) for row in expected)
    for pad in (0, -7, -7.0):  # (a float pad of an integer column, as a converter may pass)
        want = [row + [pad] * (width - len(row)) for row in expected]
        padded = pad_rows(values, starts, lengths, pad)
        assert padded.shape == (len(rows), width)
        assert padded.dtype == values.dtype
        assert padded.tolist() == want
        # Into a buffer (a worker's transport buffer), whatever it held before, and wider.
        for dtype in (np.int32, np.int64):
            out = np.full((len(rows), width), 12345, dtype)
            assert pad_rows(values, starts, lengths, pad, out=out) is out
            assert out.tolist() == want


@pytest.mark.parametrize(("low", "high"), [(0, 40), (32, 992)])
def test_the_converter_gives_the_same_rows_either_way(low: int, high: int) -> None:
    values, offsets = _lists(5, 500, low, high)
    batch = pa.record_batch({"t": pa.ListArray.from_arrays(pa.array(offsets), pa.array(values))})
    rows = np.random.default_rng(1).permutation(500)[:128]
    expected = batch.column(0).take(pa.array(rows)).to_pylist()
    offsets_out = Converter(batch.schema, list_format="offsets")(batch, rows)
    got, ends = offsets_out["t"].tolist(), offsets_out["t_offsets"].tolist()
    assert [got[a:b] for a, b in itertools.pairwise(ends)] == expected
    padded = Converter(batch.schema, list_format="padded", pad_value=-1)(batch, rows)
    lengths = padded["t_lengths"].tolist()
    assert lengths == [len(r) for r in expected]
    rows_out = list(zip(padded["t"].tolist(), lengths, strict=True))
    assert [row[:m] for row, m in rows_out] == expected
    assert all(v == -1 for row, m in rows_out for v in row[m:])


@pytest.mark.parametrize("list_format", ["padded", "offsets"])
def test_small_batches_of_blocks_in_turn_get_their_own_blocks_rows(list_format: str) -> None:
    """A block's list values are viewed once for all its batches: batches of two blocks in
    turn (one of them a slice, its offsets not starting at 0), of variable and fixed-size
    lists, each get their own block's rows."""
    blocks = []
    for seed in (1, 2):
        values, offsets = _lists(seed, 400, 0, 40)
        lists = pa.ListArray.from_arrays(pa.array(offsets), pa.array(values))
        fixed = pa.FixedSizeListArray.from_arrays(pa.array(values[: 400 * 3]), 3)
        blocks.append(pa.record_batch({"t": lists, "f": fixed}))
    blocks[1] = blocks[1].slice(37, 300)
    converter = Converter(blocks[0].schema, list_format=list_format, pad_value=-1)
    rng = np.random.default_rng(3)
    for turn in range(6):
        block = blocks[turn % 2]
        rows = rng.permutation(block.num_rows)[:32]
        out = converter(block, rows)
        want = block.take(pa.array(rows))
        assert out["f"].tolist() == want.column("f").to_pylist()
        if list_format == "padded":
            padded = list(zip(out["t"].tolist(), out["t_lengths"].tolist(), strict=True))
            got = [row[:m] for row, m in padded]
            assert all(v == -1 for row, m in padded for v in row[m:])
        else:
            flat, ends = out["t"].tolist(), out["t_offsets"].tolist()
            got = [flat[a:b] for a, b in itertools.pairwise(ends)]
        assert got == want.column("t").to_pylist()


@pytest.mark.parametrize(("low", "high"), SHAPES)
@pytest.mark.parametrize("cuts", [[120], [1, 150, 150, 299], [0, 300]], ids=str)
def test_rows_from_a_blocks_parts_are_the_joined_blocks_rows(
    low: int, high: int, cuts: list[int]
) -> None:
    """`ListParts` gathers each row from its own part's values (parts that are slices of
    their values, an empty part, rows near a part's end) as `ListRows` does from the joined
    values, end to end and padded, into a buffer whatever it held."""
    values, offsets = _lists(low + high, 300, low, high)
    joined = pa.ListArray.from_arrays(pa.array(offsets), pa.array(values))
    bounds = [0, *cuts, 300]
    # Each part its own values, and a slice of them (two lists before it left out).
    junk = pa.array([[-1] * 3, [-2] * high], joined.type)
    chunks = [
        pa.concat_arrays([junk, joined.slice(a, b - a)]).slice(2)
        for a, b in itertools.pairwise(bounds)
    ]
    part_values = tuple(np.asarray(c.values) for c in chunks)  # (each chunk's whole child)
    part_offsets = tuple(np.asarray(c.offsets).astype(np.int64) for c in chunks)
    starts_of_parts = np.array(bounds[:-1], np.int64)
    for rows in (np.random.default_rng(high).permutation(300), np.array([299, 0, 150])):
        picks = Picks(starts_of_parts, rows).parts
        expected = joined.take(pa.array(rows)).to_pylist()
        for pad in (None, 0, -7, -7.0):
            got = list_parts(part_values, part_offsets, picks, len(rows), pad)
            assert got.lengths.tolist() == [len(r) for r in expected]
            out = np.full(got.shape(), 12345, np.int64)
            got.into(out)
            if pad is None:
                assert out.tolist() == [v for row in expected for v in row]
                continue
            width = max(len(r) for r in expected)
            assert out.shape == (len(rows), width)
            assert out.tolist() == [r + [pad] * (width - len(r)) for r in expected]


def test_no_rows_from_a_blocks_parts() -> None:
    values, offsets = _lists(0, 10, 0, 5)
    got = list_parts((values,), (offsets,), Picks(np.zeros(1, np.int64), np.arange(0)).parts, 0)
    assert got.shape() == (0,)
    out = np.empty(0, values.dtype)
    got.into(out)
    padded = list_parts((values,), (offsets,), [(np.arange(0), np.arange(0))], 0, pad=-1)
    assert padded.shape() == (0, 0)
