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


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (
            lambda: tdu.Source("a/", wieght=2),
            r"^Source got .* 'wieght' \(did you mean 'weight'\?\)",
        ),
        (lambda: tdu.Source("a/", colums=["x"]), r"'colums' \(did you mean 'columns'\?\)"),
        (
            lambda: tdu.Packing("t", seqlen=8),
            r"^Packing got .* 'seqlen' \(did you mean 'seq_len'\?\)",
        ),
        (lambda: tdu.Packing("t", 8, static_shapes=True), r"did you mean 'static_shape'\?"),
        (
            lambda: tdu.TokenBudget("t", max_token=8),
            r"^TokenBudget got .*did you mean 'max_tokens'",
        ),
    ],
)
def test_a_misspelled_keyword_of_an_option_value_names_the_closest_one(
    make: Any, message: str
) -> None:
    with pytest.raises(tdu.UnknownKeywordError, match=message) as info:
        make()
    assert isinstance(info.value, TypeError)  # as Python's own error was


def test_the_option_values_that_check_keywords_stay_dataclasses() -> None:
    import dataclasses
    import pickle

    packing = tdu.Packing("tokens", seq_len=8, method="best_fit")
    assert dataclasses.is_dataclass(packing) and pickle.loads(pickle.dumps(packing)) == packing
    assert dataclasses.replace(packing, seq_len=16).seq_len == 16
    source = tdu.Source("a/", weight=2.0)
    assert pickle.loads(pickle.dumps(source)) == source and hash(packing)
    assert dataclasses.replace(source, weight=3.0).weight == 3.0


def test_a_token_budget_refuses_a_batch_size_it_would_ignore(source: Path) -> None:
    budget = tdu.TokenBudget("tokens", max_tokens=16)
    with pytest.raises(tdu.InvalidArgumentError, match="the token budget replaces batch_size"):
        tdu.create_dataloader(source, num_workers=0, batching=budget, batch_size=8)
    # The default batch_size is not one given: the budget alone cuts the batches.
    loader = tdu.create_dataloader(source, num_workers=0, batching=budget, null_policy="fill")
    assert sum(len(b["id"]) for b in loader) == 50


@pytest.mark.parametrize("columns", [["id"], ["tokens", "id"]])
def test_packing_refuses_columns_a_packed_batch_would_drop(source: Path, columns: Any) -> None:
    packing = tdu.Packing("tokens", seq_len=8)
    with pytest.raises(tdu.InvalidArgumentError) as info:
        tdu.create_dataloader(source, num_workers=0, packing=packing, columns=columns)
    message = str(info.value)
    assert "cannot carry 'id'" in message and "columns=['tokens']" in message
    for key in ("input_ids", "position_ids", "document_ids", "cu_seqlens", "max_seqlen"):
        assert key in message
    # A mixture's sources alike, its source_column named among what a batch holds.
    mixture = [tdu.Source(str(source)), tdu.Source(str(source), name="ids", columns=columns)]
    with pytest.raises(tdu.InvalidArgumentError, match=r"^the source 'ids': .*'src' \(the mix"):
        tdu.create_dataloader(mixture, num_workers=0, packing=packing, source_column="src")


@pytest.mark.parametrize("columns", [["tokens"], None])
def test_packing_takes_its_own_column_or_no_columns(source: Path, columns: Any) -> None:
    packing = tdu.Packing("tokens", seq_len=8)
    loader = tdu.create_dataloader(source, num_workers=0, packing=packing, columns=columns)
    assert set(next(iter(loader))) == {
        "input_ids",
        "position_ids",
        "document_ids",
        "cu_seqlens",
        "max_seqlen",
    }


@pytest.mark.parametrize(
    "keyword",
    [{"weights_schedule": [(0, [1.0])]}, {"mixing": "stratified"}, {"epoch_rows": 10}],
)
def test_a_mixtures_keyword_on_one_source_says_it_needs_a_mixture(
    source: Path, keyword: dict[str, Any]
) -> None:
    with pytest.raises(tdu.UnknownKeywordError) as info:
        tdu.create_dataloader(source, num_workers=0, **keyword)
    message = str(info.value)
    assert f"{next(iter(keyword))!r} (a mixture's keyword" in message
    assert "list of tdu.Source" in message
    # A mixture of one source takes it.
    loader = tdu.create_dataloader([tdu.Source(str(source))], num_workers=0, **keyword)
    assert len(loader) > 0
