"""Arrays to and from numpy through their buffers: what pyarrow's own conversions give, and no
pandas loaded (pyarrow's load it, 0.1-0.25 s of a process's first batch)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from torch_dataloader_utils.convert.arrow_values import (
    arrow_of,
    bool_view,
    numpy_view,
    valid_view,
)

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


@pytest.mark.parametrize("dtype", [np.int64, np.int32, np.uint8, np.float32, np.float64])
def test_arrow_of_gives_what_pa_array_gives(dtype: type) -> None:
    values = np.arange(-3, 12)[::2].astype(dtype)  # (not contiguous)
    assert arrow_of(values).equals(pa.array(values))
    valid = values % 3 != 0
    got = arrow_of(values, valid=valid)
    assert got.equals(pa.array(values, mask=~valid))
    assert got.null_count == int((~valid).sum())
    assert arrow_of(np.zeros(0, dtype)).equals(pa.array(np.zeros(0, dtype)))


@pytest.mark.parametrize(("offset", "length"), [(0, 21), (3, 9), (5, 16), (21, 0)])
def test_bits_give_what_to_numpy_gives(offset: int, length: int) -> None:
    flags = [i % 3 == 0 for i in range(21)]
    booleans = pa.array(flags).slice(offset, length)
    assert bool_view(booleans).tolist() == booleans.to_numpy(zero_copy_only=False).tolist()
    with_nulls = [None if i % 4 == 1 else i for i in range(21)]
    for array in (
        pa.array(with_nulls).slice(offset, length),
        pa.array([[v] if v is not None else None for v in with_nulls]).slice(offset, length),
        pa.array(with_nulls).dictionary_encode().slice(offset, length),
        pa.array([None] * 21).slice(offset, length),
        pa.array(range(21)).slice(offset, length),
    ):
        want = array.is_valid().to_numpy(zero_copy_only=False)
        assert valid_view(array).tolist() == want.tolist(), array.type


def _pandas_free_epoch(root: Path, workers: int, options: str, delivered: str) -> str:
    """Runs an epoch of a loader made with ``options`` in a process of its own; ``delivered``:
    what each batch adds to ``got`` (the test checks ``got``, printed as JSON)."""
    # A finder that notes any import of pandas, in this process and in the forked workers.
    code = (
        "import collections, json, os, sys, torch\n"
        "import torch_dataloader_utils as tdu\n"
        "class Noted:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name == 'pandas':\n"
        f"            open(os.path.join({str(root)!r}, f'pandas-{{os.getpid()}}'), 'w').close()\n"
        "sys.meta_path.insert(0, Noted())\n"
        f"loader = tdu.create_dataloader({str(root)!r}, shuffle=True, num_workers={workers},\n"
        f"    multiprocessing_context='fork', {options})\n"
        "got = []\n"
        "for batch in loader:\n"
        f"    got += {delivered}\n"
        "    assert 'pandas' not in sys.modules, 'after a batch'\n"
        "print(json.dumps(sorted(got)))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], check=False, capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr
    assert not list(root.glob("pandas-*")), "a process loaded pandas"
    return out.stdout.strip().splitlines()[-1]


def _tokens(i: int) -> list[int | None] | None:
    """Row ``i``'s token list: null every 9th row, a null token in every 10th."""
    if i % 9 == 0:
        return None
    return [None if i % 10 == 0 and k == 0 else i * 10 + k for k in range(i % 4 + 1)]


# Strings, lists and fixed-size lists with nulls, booleans: the columns whose conversions went
# through pyarrow's numpy conversion; then packed sequences and token budgets over the lists.
CONVERSIONS = [
    ("list_format='padded', batch_size=16, null_policy='mask'", "batch['id'].tolist()", "ids"),
    ("list_format='offsets', batch_size=16, null_policy='mask'", "batch['id'].tolist()", "ids"),
    (
        "columns=['tokens'], batch_size=2, packing=tdu.Packing('tokens', 8, pad_value=-1), "
        "null_policy='fill'",
        "batch['input_ids'][batch['document_ids'] >= 0].tolist()",
        "tokens",
    ),
    (
        "batching=tdu.TokenBudget('tokens', max_tokens=16), null_policy='fill'",
        "batch['id'].tolist()",
        "ids",
    ),
]


@pytest.mark.parametrize(("options", "delivered", "expected"), CONVERSIONS)
@pytest.mark.parametrize("workers", [0, 2])
def test_an_epoch_loads_no_pandas(
    tmp_path: Path, workers: int, options: str, delivered: str, expected: str
) -> None:
    # The workers are forked: what the main process loads, they have; the finder notes what
    # they load.
    n = 60
    ids = np.arange(n)
    table = pa.table(
        {
            "id": ids,
            "x": pa.array([None if i % 7 == 0 else float(i) for i in ids]),
            "flag": pa.array([None if i % 5 == 0 else i % 2 == 0 for i in ids]),
            "name": pa.array([None if i % 6 == 0 else f"n{i}" for i in ids]),
            "tokens": pa.array([_tokens(i) for i in ids], pa.list_(pa.int32())),
            "emb": pa.array(
                [None if i % 8 == 0 else [float(i), None] for i in ids], pa.list_(pa.float32(), 2)
            ),
        }
    )
    for part in range(3):
        pq.write_table(table.slice(part * 20, 20), tmp_path / f"part-{part}.parquet")
    got = json.loads(_pandas_free_epoch(tmp_path, workers, options, delivered))
    if expected == "ids":
        assert got == list(range(n))
    else:  # every token once, a null one as 0
        want = [t or 0 for i in range(n) for t in (_tokens(i) or [])]
        assert got == sorted(want)
