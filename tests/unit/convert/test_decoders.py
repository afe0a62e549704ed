"""Per-value decoders applied after conversion: stacked when the values share shape and dtype."""

from __future__ import annotations

import json
import pickle
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

import torch_dataloader_utils as tdu
from torch_dataloader_utils.convert import Decoding
from torch_dataloader_utils.formats import get_format
from torch_dataloader_utils.formats.parquet import ParquetFormat


def _array(value: bytes) -> np.ndarray:
    return np.frombuffer(value, dtype=np.uint8).copy()


def test_same_shape_arrays_stack_into_one_tensor() -> None:
    decode = Decoding({"blob": _array}, output_format="torch")
    batch = decode({"blob": [b"ab", b"cd", b"ef"], "id": torch.arange(3)})
    assert isinstance(batch["blob"], torch.Tensor)
    assert batch["blob"].tolist() == [[97, 98], [99, 100], [101, 102]]
    assert batch["id"].tolist() == [0, 1, 2]


def test_ragged_values_stay_a_list_and_numpy_output_stays_numpy() -> None:
    ragged = Decoding({"blob": _array}, output_format="torch")({"blob": [b"a", b"bc"]})
    assert isinstance(ragged["blob"], list)
    assert [v.tolist() for v in ragged["blob"]] == [[97], [98, 99]]
    same = Decoding({"blob": _array}, output_format="numpy")({"blob": [b"a", b"b"]})
    assert isinstance(same["blob"], np.ndarray)
    assert same["blob"].tolist() == [[97], [98]]
    as_dict = Decoding({"blob": _array}, output_format="dict")({"blob": [b"a", b"b"]})
    assert isinstance(as_dict["blob"], list)


def test_objects_stay_a_list_and_the_user_collate_runs_after() -> None:
    decode = Decoding(
        {"meta": json.loads}, output_format="torch", collate=lambda b: {**b, "seen": True}
    )
    batch = decode({"meta": ['{"a": 1}', "[2]"]})
    assert batch == {"meta": [{"a": 1}, [2]], "seen": True}


def test_decoding_pickles() -> None:
    decode = pickle.loads(pickle.dumps(Decoding({"meta": json.loads}, output_format="torch")))
    assert decode({"meta": ["1"]}) == {"meta": [1]}


class Doubled(ParquetFormat):
    """A format whose ``name`` column is decoded, to check the dataset applies decoders."""

    def decoders(self, schema: pa.Schema) -> dict[str, Any]:
        return {"name": _twice} if "name" in schema.names else {}


def _twice(value: str) -> str:
    return value * 2


@pytest.mark.parametrize("num_workers", [0, 2])
def test_the_dataset_applies_a_formats_decoders_in_its_workers(
    tmp_path: Path, num_workers: int
) -> None:
    ids = np.arange(50)
    table = pa.table({"id": ids, "name": [f"r{i}" for i in ids]})
    pq.write_table(table, tmp_path / "a.parquet", row_group_size=10)
    loader = tdu.create_dataloader(
        tmp_path, format=Doubled(), batch_size=8, num_workers=num_workers, shuffle=True
    )
    seen = [(i, n) for b in loader for i, n in zip(b["id"].tolist(), b["name"], strict=True)]
    assert sorted(i for i, _ in seen) == ids.tolist()
    assert all(n == f"r{i}" * 2 for i, n in seen)
    arrow = tdu.create_dataloader(tmp_path, format=Doubled(), output_format="arrow", num_workers=0)
    names = [n for b in arrow for n in b.column("name").to_pylist()]
    assert sorted(names) == sorted(f"r{i}" for i in ids)  # Arrow output is never decoded


def test_format_options_reach_the_format_and_are_checked() -> None:
    with pytest.raises(tdu.InvalidArgumentError, match="does not take format_options"):
        get_format("parquet", {"delimiter": ";"})
    with pytest.raises(tdu.InvalidArgumentError, match="already configured"):
        get_format(ParquetFormat(), {"anything": 1})
    assert isinstance(get_format("pq", {}), ParquetFormat)


def _strict_int(value: str) -> int:
    return int(value)


def test_a_value_that_does_not_decode_names_the_sample_when_the_batch_says_which() -> None:
    decode = Decoding({"n": _strict_int}, output_format="torch")
    batch = {"__url__": ["s3://b/a.tar", "s3://b/a.tar"], "__key__": ["k0", "k1"], "n": ["1", "x"]}
    with pytest.raises(tdu.CorruptFileError, match=r"s3://b/a\.tar: sample 'k1', column 'n'"):
        decode(batch)
    with pytest.raises(tdu.CorruptFileError, match="column 'n', row 1 of a batch"):
        decode({"n": ["1", "x"]})


def _refuses(value: str) -> str:
    raise tdu.CorruptFileError("not JSON")


def test_a_data_error_keeps_its_type_and_gains_the_sample() -> None:
    decode = Decoding({"j": _refuses}, output_format="dict")
    with pytest.raises(tdu.CorruptFileError, match=r"^u: sample 'k', column 'j': not JSON$"):
        decode({"__url__": ["u"], "__key__": ["k"], "j": ["{"]})


def _buggy(value: str) -> str:
    return undefined_name  # type: ignore[name-defined]  # noqa: F821


def test_a_bug_in_a_decoder_keeps_its_type_and_says_where() -> None:
    decode = Decoding({"j": _buggy}, output_format="dict")
    with pytest.raises(NameError) as info:
        decode({"__url__": ["u"], "__key__": ["k"], "j": ["{"]})
    assert "while decoding u: sample 'k', column 'j'" in info.value.__notes__
