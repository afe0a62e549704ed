"""Rows of list columns gathered end to end or padded: every strategy (slices, one gather,
windows) gives each row's list, checked against plain Python over narrow and wide rows."""

from __future__ import annotations

import itertools

import numpy as np
import pyarrow as pa
import pytest

from torch_dataloader_utils.convert import Converter
from torch_dataloader_utils.convert.lists import gather_rows, pad_rows


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
def test_each_row_laid_end_to_end_and_padded(low: int, high: int, seed: int) -> None:
    values, offsets = _lists(seed, 300, low, high)
    rows = np.random.default_rng(seed + 9).permutation(300)[:257]  # the last list included
    rows[0] = 299
    starts = offsets[rows].astype(np.int64)
    lengths = offsets[rows + 1].astype(np.int64) - starts
    expected = [values[a : a + m].tolist() for a, m in zip(starts, lengths, strict=True)]
    laid = gather_rows(values, starts, lengths)
    assert laid.dtype == values.dtype
    assert laid.tolist() == [v for row in expected for v in row]
    for pad in (0, -7):
        padded = pad_rows(values, starts, lengths, pad)
        width = max(len(row) for row in expected)
        assert padded.shape == (len(rows), width)
        assert padded.tolist() == [row + [pad] * (width - len(row)) for row in expected]


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
