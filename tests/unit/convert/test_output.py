"""`convert.Output`: a dataset's conversion options, refused when made out of range, and the
converter they make."""

from __future__ import annotations

from typing import Any

import pyarrow as pa
import pytest

from torch_dataloader_utils.convert import Output
from torch_dataloader_utils.errors import InvalidArgumentError


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"list_format": "nested", "format": "numpy"}, "nested.*needs"),
        ({"format": "pandas"}, "output_format must be one of"),
        ({"list_format": "ragged"}, "list_format must be one of"),
        ({"null_policy": "ignore"}, "null_policy must be one of"),
    ],
)
def test_options_out_of_range_are_refused_when_made(options: dict[str, Any], message: str) -> None:
    with pytest.raises(InvalidArgumentError, match=message):
        Output(**options)


def test_the_converter_takes_every_option() -> None:
    output = Output(format="numpy", list_format="offsets", null_policy="fill", pad_value=-1)
    converter = output.converter(pa.schema([("a", pa.list_(pa.int64()))]))
    assert (
        converter.output_format,
        converter.list_format,
        converter.null_policy,
        converter.pad_value,
    ) == ("numpy", "offsets", "fill", -1)
    batch = pa.record_batch({"a": pa.array([[1, 2], None, [3]], pa.list_(pa.int64()))})
    out = converter(batch)
    assert out["a"].tolist() == [1, 2, 3] and out["a_offsets"].tolist() == [0, 2, 2, 3]
