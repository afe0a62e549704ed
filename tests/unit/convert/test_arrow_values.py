"""Numeric columns read into numpy from their buffer: what ``to_numpy`` gives, and no pandas."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from torch_dataloader_utils.convert.arrow_values import numpy_view

NUMERIC = [pa.int8(), pa.int16(), pa.int32(), pa.int64(), pa.uint8(), pa.uint64()]
NUMERIC += [pa.float16(), pa.float32(), pa.float64()]


@pytest.mark.parametrize("dtype", NUMERIC, ids=str)
@pytest.mark.parametrize(("offset", "length"), [(0, 10), (3, 5), (10, 0), (0, 0)])
def test_a_numeric_array_gives_what_to_numpy_gives(
    dtype: pa.DataType, offset: int, length: int
) -> None:
    values = np.arange(10).astype(dtype.to_pandas_dtype())
    array = pa.chunked_array([values], type=dtype).chunk(0).slice(offset, length)
    got = numpy_view(array)
    want = array.to_numpy(zero_copy_only=True)
    assert got.dtype == want.dtype and got.tolist() == want.tolist()
    assert not got.flags.writeable or not len(got)


def test_other_arrays_go_through_to_numpy() -> None:
    with pytest.raises(pa.ArrowInvalid):  # (nulls: to_numpy refuses a zero-copy view)
        numpy_view(pa.array([1, None], pa.int64()))
    stamps = pa.array([0, 1], pa.timestamp("s"))
    assert numpy_view(stamps).dtype == np.dtype("datetime64[s]")


def test_reading_a_file_into_numpy_loads_no_pandas(tmp_path: Path) -> None:
    # A spawned DataLoader worker starts without pandas; pyarrow's to_numpy loads it (0.25 s
    # of the worker's first batch).
    path = tmp_path / "numbers.parquet"
    pq.write_table(pa.table({"id": np.arange(50), "x": np.ones(50, np.float32)}), path)
    code = (
        "import sys, pyarrow.parquet as pq\n"
        "from torch_dataloader_utils.convert.arrow_values import numpy_view\n"
        f"batch = pq.ParquetFile({str(path)!r}).read_row_group(0).to_batches()[0]\n"
        "assert numpy_view(batch.column(0)).sum() == 1225\n"
        "assert numpy_view(batch.column(1)).sum() == 50\n"
        "print('pandas' in sys.modules)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], check=False, capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False"
