"""A plan's columns pickled: every array back as it was, offsets and file numbers as steps."""

from __future__ import annotations

import pickle

import numpy as np
import pyarrow as pa
import pytest

from torch_dataloader_utils.planning.arrays import NamedArrays, smallest, strings

EDGES = np.array([np.iinfo(np.int64).min, -1, 0, 1, np.iinfo(np.int64).max], np.int64)


@pytest.mark.parametrize(
    "array",
    [
        np.arange(0, 71 * 20_001, 71, dtype=np.int32),  # offsets: steps of one size
        np.arange(20_000, dtype=np.int16),  # file numbers
        np.array([5, -3, 120, -128, 127], np.int8),
        np.array([2**40, 2**40 + 1, 7], np.int64),
        EDGES,  # steps overflow int64: they wrap, and the sum wraps back
        np.array([-(2**31), 2**31 - 1, 0], np.int32),
        np.array([3], np.int16),
        np.zeros(0, np.int32),
        np.frombuffer(b"/data/part-0.parquet", np.uint8),
        np.array([0.5, -1.0], np.float64),
    ],
)
def test_every_column_comes_back_as_it_was(array: np.ndarray) -> None:
    again = pickle.loads(pickle.dumps(NamedArrays({"a": array, "b": smallest(np.arange(9))})))
    got = again.arrays["a"]
    assert got.dtype == array.dtype and got.shape == array.shape
    assert np.array_equal(got, array)
    assert not got.flags.writeable
    assert again.arrays["b"].tolist() == list(range(9))


@pytest.mark.skipif(not pa.Codec.is_available("zstd"), reason="pickled uncompressed")
def test_offsets_and_file_numbers_pickle_to_almost_nothing() -> None:
    n = 100_000
    _, offsets = strings([f"/data/part-{i:06d}.parquet" for i in range(n)])
    columns = NamedArrays({"file": smallest(np.arange(n)), "path_offsets": smallest(offsets)})
    assert columns.arrays["path_offsets"].nbytes + columns.arrays["file"].nbytes > 500_000
    assert len(pickle.dumps(columns)) < 5_000
