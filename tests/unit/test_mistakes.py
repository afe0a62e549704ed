"""Ordinary mistakes are refused at the call, naming the fix: misspelled keywords and format
options (the closest valid name), flags that are not booleans, ``columns=[]``; and the repr of
a local dataset shows no storage."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import torch_dataloader_utils as tdu

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def source(parquet_dir: Any) -> Path:
    root, _ = parquet_dir((30, 20))
    return root


@pytest.mark.parametrize(
    ("given", "closest"),
    [("shufle", "shuffle"), ("batchsize", "batch_size"), ("num_worker", "num_workers")],
)
def test_a_misspelled_keyword_names_the_closest_one(source: Path, given: str, closest: str) -> None:
    with pytest.raises(tdu.UnknownKeywordError) as info:
        tdu.create_dataloader(source, num_workers=0, **{given: 1})
    message = str(info.value)
    assert f"{given!r}" in message and f"did you mean {closest!r}?" in message
    assert "__init__" not in message  # not the internal class's signature
    assert isinstance(info.value, TypeError)  # as Python's own error was


def test_a_misspelled_keyword_of_the_earlier_api_is_still_a_type_error(source: Path) -> None:
    with pytest.raises(TypeError, match=r"'colums' \(did you mean 'columns'\?\)"):
        tdu.StructuredDataset.create_dataloader(path=str(source), num_workers=0, colums=["id"])
    with pytest.raises(tdu.InvalidArgumentError, match="did you mean 'shuffle_seed'"):
        tdu.StructuredDataset(source, shuffle_sed=3)


def test_a_keyword_with_nothing_close_is_named_alone(source: Path) -> None:
    with pytest.raises(tdu.UnknownKeywordError, match=r"argument 'zzz'$"):
        tdu.StructuredDataset(source, zzz=3)


@pytest.mark.parametrize(
    ("fmt", "options", "closest", "listed"),
    [
        ("webdataset", {"missing_components": "skip"}, "missing_component", "decode_images"),
        ("csv", {"delimter": ";"}, "delimiter", "quote_char"),
        ("parquet", {"verify_checksum": True}, "verify_checksums", "verify_checksums"),
    ],
)
def test_a_misspelled_format_option_lists_the_valid_ones(
    fmt: str, options: dict[str, Any], closest: str, listed: str
) -> None:
    with pytest.raises(tdu.UnknownKeywordError) as info:
        tdu.get_format(fmt, options)
    message = str(info.value)
    assert f"did you mean {closest!r}?" in message
    assert "it takes: " in message and listed in message.split("it takes: ")[1]


@pytest.mark.parametrize(
    "options",
    [
        {"shuffle": "yes"},
        {"shuffle": 1},
        {"drop_last": "no"},
        {"persistent_workers": "true", "num_workers": 1},
        {"pin_memory": "false"},
    ],
)
def test_flags_must_be_booleans(source: Path, options: dict[str, Any]) -> None:
    name = next(iter(options))
    options.setdefault("num_workers", 0)
    with pytest.raises(tdu.InvalidArgumentError, match=rf"^{name} must be True or False, got "):
        tdu.create_dataloader(source, **options)


def test_a_format_flag_must_be_a_boolean() -> None:
    with pytest.raises(tdu.InvalidArgumentError, match="decode_images must be True or False"):
        tdu.get_format("webdataset", {"decode_images": "no"})


def test_numpy_booleans_are_booleans(source: Path) -> None:
    import numpy as np

    loader = tdu.create_dataloader(source, num_workers=0, shuffle=np.True_)
    assert loader.dataset.shuffle


@pytest.mark.parametrize("columns", [[], (), ["id", 3], iter(["id"])])
def test_columns_must_name_columns(source: Path, columns: Any) -> None:
    with pytest.raises(tdu.InvalidArgumentError, match="columns must"):
        tdu.create_dataloader(source, num_workers=0, columns=columns)


def test_the_repr_of_a_local_dataset_shows_no_storage(source: Path) -> None:
    dataset = tdu.StructuredDataset(source, batch_size=16, shuffle=True)
    assert repr(dataset) == (
        "StructuredDataset(format='parquet', chunks=2, rows=50, batch_size=16, shuffle=True)"
    )


def test_the_repr_names_storage_option_keys_never_their_values(source: Path) -> None:
    dataset = tdu.StructuredDataset(f"file://{source}", storage_options={"secret": "hunter2"})
    text = repr(dataset)
    assert "protocol='file', storage_options={'secret': ...}" in text
    assert "hunter2" not in text


def test_a_mixture_refuses_non_boolean_flags_and_names_misspelled_keywords(source: Path) -> None:
    mixture = [tdu.Source(str(source))]
    with pytest.raises(tdu.InvalidArgumentError, match=r"^shuffle must be True or False"):
        tdu.create_dataloader(mixture, num_workers=0, shuffle="yes")
    with pytest.raises(tdu.UnknownKeywordError, match=r"'colums' \(did you mean 'columns'\?\)"):
        tdu.create_dataloader(mixture, num_workers=0, colums=["id"])
    with pytest.raises(tdu.UnknownKeywordError, match=r"'shufle' \(did you mean 'shuffle'\?\)"):
        tdu.create_dataloader(mixture, num_workers=0, shufle=True)


def test_an_iceberg_dataset_names_a_misspelled_keyword() -> None:
    # Refused before any catalog is asked for the table.
    with pytest.raises(tdu.UnknownKeywordError, match=r"did you mean 'shuffle_seed'\?"):
        tdu.IcebergDataset("db.events", catalog_config={"type": "sql"}, shuffle_sed=1)
