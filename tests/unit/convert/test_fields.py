"""The last step of a conversion (`convert.fields`): each kind of a `Field`'s data becomes the
same numpy array or tensor, a null-free Arrow array without a copy."""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa
import pytest
import torch

from torch_dataloader_utils.convert import Field, Gather, as_numpy, as_tensor
from torch_dataloader_utils.convert.arrow_values import numpy_view

ROWS = np.arange(12, dtype=np.int32).reshape(6, 2)


@pytest.mark.parametrize(
    ("data", "shape"),
    [
        (pa.array(ROWS[[4, 1]].reshape(-1)), (2, 2)),
        (ROWS[[4, 1]].reshape(-1), (2, 2)),
        (Gather(ROWS, np.array([4, 1])), (2, 2)),
        (Gather(ROWS, np.array([4, 1])), (4,)),
    ],
    ids=["arrow", "numpy", "gather", "gather-reshaped"],
)
def test_every_kind_of_data_gives_the_same_values(data: Any, shape: tuple[int, ...]) -> None:
    want = ROWS[[4, 1]].reshape(shape)
    array = as_numpy(Field("x", data, shape))
    tensor = as_tensor(Field("x", data, shape))
    assert isinstance(array, np.ndarray) and array.dtype == np.int32 and array.shape == shape
    np.testing.assert_array_equal(array, want)
    assert isinstance(tensor, torch.Tensor) and tensor.dtype == torch.int32
    assert tensor.tolist() == want.tolist()


def test_an_arrow_array_is_viewed_not_copied() -> None:
    values = pa.array(np.arange(8, dtype=np.int64))
    address = numpy_view(values).ctypes.data
    assert as_numpy(Field("x", values, (4, 2))).ctypes.data == address
    assert as_tensor(Field("x", values, (4, 2))).data_ptr() == address


def test_a_field_without_a_shape_is_a_list() -> None:
    strings = pa.array(["a", None, "c"])
    assert as_numpy(Field("s", strings, None)) == ["a", None, "c"]
    assert as_tensor(Field("s", strings, None)) == ["a", None, "c"]
    assert as_tensor(Field("v", [{"k": 1}], None)) == [{"k": 1}]
