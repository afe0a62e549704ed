"""StructuredDataset end to end, in process (``num_workers=0``): what is read, how it comes out.

Every test that reads checks the multiset of ids against a brute-force answer computed with
numpy from the ids the files were written with, and row contents against ``make_table``.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
import torch

import torch_dataloader_utils as tdu
from tests.conftest import first_error, make_table, write_parquet

pytestmark = pytest.mark.timeout(60)

SIZES = (250, 1000, 0, 333, 17)  # ids 0..1599 across five files, one without rows
ROWS = sum(SIZES)
ALL_IDS = np.arange(ROWS)
BATCH = 64


def load(source: Any, **options: Any) -> tdu.TabularDataLoader:
    options.setdefault("batch_size", BATCH)
    return tdu.create_dataloader(source, format="parquet", num_workers=0, **options)


def ids_of(batch: Any) -> list[int]:
    """The ids of a batch in any output format."""
    if isinstance(batch, pa.RecordBatch):
        return batch.column("id").to_pylist()
    return [int(i) for i in batch["id"]]


def read_ids(loader: Any) -> list[int]:
    return [i for batch in loader for i in ids_of(batch)]


def batch_sizes(loader: Any) -> list[int]:
    return [len(ids_of(batch)) for batch in loader]


@pytest.fixture
def source(parquet_dir: Any) -> Path:
    root, rows = parquet_dir(SIZES)
    assert rows == ROWS
    return root


# --- columns ---------------------------------------------------------------------------------


def test_columns_project_to_exactly_those_keys(source: Path) -> None:
    seen = []
    for batch in load(source, columns=["label", "id"], shuffle=True):
        assert list(batch) == ["label", "id"]
        ids = batch["id"].numpy()
        np.testing.assert_array_equal(batch["label"].numpy(), ids % 7)
        seen.extend(ids.tolist())
    assert Counter(seen) == Counter(ALL_IDS.tolist())


def test_filter_only_columns_are_not_in_the_output(source: Path) -> None:
    loader = load(source, columns=["x", "id"], filters=(pc.field("label") == 3) & pc.field("flag"))
    seen = []
    for batch in loader:
        assert set(batch) == {"x", "id"}
        ids = batch["id"].numpy()
        np.testing.assert_array_equal(batch["x"].numpy(), (ids * 0.5).astype(np.float32))
        seen.extend(ids.tolist())
    expected = ALL_IDS[(ALL_IDS % 7 == 3) & (ALL_IDS % 2 == 0)]
    assert Counter(seen) == Counter(expected.tolist())
    arrow = load(source, columns=["x", "id"], filters=pc.field("label") == 3, output_format="arrow")
    assert all(batch.schema.names == ["x", "id"] for batch in arrow)


def test_no_columns_reads_every_column(source: Path) -> None:
    batch = next(iter(load(source)))
    assert list(batch) == ["id", "x", "label", "flag", "name", "emb", "tokens", "tokens_lengths"]


# --- filters ---------------------------------------------------------------------------------

IdsMask = Callable[[np.ndarray], np.ndarray]
# Expressions have no % operator: "id % 3 == 0" is spelled with integer division.
ID_MOD_3 = pc.subtract(pc.field("id"), pc.multiply(pc.divide(pc.field("id"), 3), 3)) == 0
FILTERS: dict[str, tuple[pc.Expression, IdsMask]] = {
    "id % 3 == 0": (ID_MOD_3, lambda i: i % 3 == 0),
    "label == 3": (pc.field("label") == 3, lambda i: i % 7 == 3),
    "range": ((pc.field("id") >= 123) & (pc.field("id") < 1234), lambda i: (i >= 123) & (i < 1234)),
    "tail": (pc.field("id") > 1500, lambda i: i > 1500),
    "head": (pc.field("id") <= 10, lambda i: i <= 10),
    "float": (pc.field("x") < 100.25, lambda i: i * 0.5 < 100.25),
    "bool and range": (
        pc.field("flag") & (pc.field("id") < 300),
        lambda i: (i % 2 == 0) & (i < 300),
    ),
    "or": ((pc.field("id") < 5) | (pc.field("id") >= 1595), lambda i: (i < 5) | (i >= 1595)),
    "isin": (pc.field("id").isin([0, 17, 1234, 1599]), lambda i: np.isin(i, [0, 17, 1234, 1599])),
    "string": (pc.field("name") == "row-333", lambda i: i == 333),
    "nothing": (pc.field("id") < 0, lambda i: i < 0),
}


@pytest.mark.parametrize("shuffle", [False, True])
@pytest.mark.parametrize("name", FILTERS)
def test_filters_keep_exactly_the_matching_rows(source: Path, name: str, shuffle: bool) -> None:
    expression, mask = FILTERS[name]
    loader = load(source, filters=expression, shuffle=shuffle, batch_size=50)
    got = read_ids(loader)
    assert Counter(got) == Counter(ALL_IDS[mask(ALL_IDS)].tolist())
    sizes = batch_sizes(loader)
    assert all(n == 50 for n in sizes[:-1]) and all(
        n > 0 for n in sizes
    )  # batches cut after filtering
    if not shuffle:
        assert got == sorted(got)


def test_range_filter_prunes_row_groups_at_plan_time(source: Path) -> None:
    # ids 500..699 live in three 100-row row groups of part-001 (ids 250..1249)
    loader = load(source, filters=(pc.field("id") >= 500) & (pc.field("id") < 700))
    assert sum(c.num_rows for c in loader.dataset.plan.chunks) == 300  # read, before the filter
    assert loader.dataset.plan.num_rows == 200  # counted at plan time: rows that pass
    with_rows = {Path(c.path).name for c in loader.dataset.plan.chunks if c.num_rows}
    assert with_rows == {"part-001.parquet"}  # (the row-less file has no statistics to prune by)
    assert Counter(read_ids(loader)) == Counter(range(500, 700))


def test_len_is_known_with_a_filter(source: Path) -> None:
    """Rows passing a filter are counted at plan time, so the batch count is known."""
    loader = load(source, filters=pc.field("id") > 3)
    assert len(loader) == len(loader.dataset) == -(-(ROWS - 4) // BATCH)
    assert len(batch_sizes(loader)) == len(loader)
    assert Counter(read_ids(loader)) == Counter(range(4, ROWS))


# --- hive partitioning -----------------------------------------------------------------------

YEARS, MONTHS, PER_FILE = (2023, 2024), (1, 2, 11), 37


@pytest.fixture
def hive(tmp_path: Path) -> tuple[Path, dict[int, tuple[int, int]]]:
    """``year=Y/month=M/part-0.parquet`` directories; returns the root and id -> (year, month)."""
    root, where, start = tmp_path / "hive", {}, 0
    for year in YEARS:
        for month in MONTHS:
            ids = np.arange(start, start + PER_FILE)
            write_parquet(
                root / f"year={year}" / f"month={month}" / "part-0.parquet", ids, row_group_size=10
            )
            where.update({int(i): (year, month) for i in ids})
            start += PER_FILE
    return root, where


def test_hive_columns_hold_each_rows_partition_values(hive: tuple[Path, dict]) -> None:
    root, where = hive
    seen = []
    for batch in load(root, partitioning="hive", shuffle=True, batch_size=16):
        assert batch["year"].dtype == batch["month"].dtype == torch.int64
        for i, year, month in zip(
            batch["id"].tolist(), batch["year"].tolist(), batch["month"].tolist(), strict=True
        ):
            assert where[i] == (year, month)
            seen.append(i)
    assert Counter(seen) == Counter(list(where))


def test_hive_columns_can_be_projected(hive: tuple[Path, dict]) -> None:
    root, where = hive
    loader = load(root, partitioning="hive", columns=["month", "id"], output_format="arrow")
    assert loader.dataset.plan.schema == pa.schema([("month", pa.int64()), ("id", pa.int64())])
    seen = []
    for batch in loader:
        assert (
            batch.schema.names == ["month", "id"] and batch.schema.field("month").type == pa.int64()
        )
        for i, month in zip(batch["id"].to_pylist(), batch["month"].to_pylist(), strict=True):
            assert where[i][1] == month
            seen.append(i)
    assert Counter(seen) == Counter(list(where))


@pytest.mark.parametrize(
    ("expression", "keep"),
    [
        (pc.field("month") == 2, lambda y, m: m == 2),
        ((pc.field("year") == 2024) & (pc.field("month") >= 2), lambda y, m: y == 2024 and m >= 2),
        (pc.field("month") > 100, lambda y, m: False),
    ],
)
def test_hive_filter_prunes_files(hive: tuple[Path, dict], expression: Any, keep: Any) -> None:
    root, where = hive
    loader = load(root, partitioning="hive", columns=["id"], filters=expression)
    planned = {
        Path(c.path).parent.parent.name + "/" + Path(c.path).parent.name
        for c in loader.dataset.plan.chunks
    }
    wanted = {f"year={y}/month={m}" for y in YEARS for m in MONTHS if keep(y, m)}
    assert planned == wanted  # the other files are not even planned
    expected = [i for i, (y, m) in where.items() if keep(y, m)]
    got = []
    for batch in loader:
        assert list(batch) == ["id"]
        got.extend(batch["id"].tolist())
    assert Counter(got) == Counter(expected)


# --- output formats --------------------------------------------------------------------------


def rows_of(batch: Any, output_format: str) -> dict[str, list[Any]]:
    """A batch as plain Python column lists, whatever its output format."""
    if output_format == "arrow":
        assert isinstance(batch, pa.RecordBatch)
        return batch.to_pydict()
    if output_format == "dict":
        assert all(isinstance(v, list) for v in batch.values())
        return batch
    array = torch.Tensor if output_format == "torch" else np.ndarray
    for key in ("id", "x", "label", "flag", "emb", "tokens", "tokens_lengths"):
        assert isinstance(batch[key], array), key
    assert isinstance(batch["name"], list)
    assert tuple(batch["emb"].shape) == (len(batch["id"]), 4)
    lengths = batch["tokens_lengths"].tolist()
    dtype = {
        k: str(batch[k].dtype).removeprefix("torch.")
        for k in ("id", "x", "label", "flag", "emb", "tokens")
    }
    assert dtype == {
        "id": "int64",
        "x": "float32",
        "label": "int64",
        "flag": "bool",
        "emb": "float32",
        "tokens": "int32",
    }
    return {
        "id": batch["id"].tolist(),
        "x": batch["x"].tolist(),
        "label": batch["label"].tolist(),
        "flag": batch["flag"].tolist(),
        "name": batch["name"],
        "emb": batch["emb"].tolist(),
        "tokens": [row[:n] for row, n in zip(batch["tokens"].tolist(), lengths, strict=True)],
    }


@pytest.mark.parametrize("output_format", ["torch", "numpy", "arrow", "dict"])
def test_outputs_carry_the_rows_of_their_ids(source: Path, output_format: str) -> None:
    reference = [ids_of(b) for b in load(source, shuffle=True, output_format="arrow")]
    got = []
    for batch in load(source, shuffle=True, output_format=output_format):
        rows = rows_of(batch, output_format)
        assert rows == make_table(np.array(rows["id"])).to_pydict()
        got.append(rows["id"])
    assert got == reference  # the same batches in the same order, whatever the format
    assert Counter(i for ids in got for i in ids) == Counter(ALL_IDS.tolist())


def test_padded_tokens_use_pad_value(source: Path) -> None:
    batch = next(iter(load(source, columns=["id", "tokens"], pad_value=-1)))
    lengths = batch["tokens_lengths"]
    width = batch["tokens"].shape[1]
    assert width == int(lengths.max())
    pad = torch.arange(width)[None, :] >= lengths[:, None]
    assert bool((batch["tokens"][pad] == -1).all())
    assert Counter(batch["id"].tolist()) == Counter(range(BATCH))


# --- batch sizes and lengths -----------------------------------------------------------------


@pytest.mark.parametrize("shuffle", [False, True])
@pytest.mark.parametrize("drop_last", [False, True])
@pytest.mark.parametrize("batch_size", [1, 7, 64, 100, 1599, 1600, 1601, 10**6])
def test_batch_sizes_and_len(source: Path, batch_size: int, drop_last: bool, shuffle: bool) -> None:
    loader = load(
        source, batch_size=batch_size, drop_last=drop_last, shuffle=shuffle, output_format="arrow"
    )
    sizes = batch_sizes(loader)
    assert len(loader) == len(sizes)
    kept = ROWS - ROWS % batch_size if drop_last else ROWS
    assert sum(sizes) == kept
    assert all(n == batch_size for n in sizes[:-1])
    if drop_last:
        assert all(n == batch_size for n in sizes)
    got = read_ids(loader)
    assert len(set(got)) == len(got) == kept
    if not drop_last:
        assert Counter(got) == Counter(ALL_IDS.tolist())
    elif not shuffle:
        assert got == list(range(kept))  # the rank's last rows are the ones dropped


def test_batch_size_one_yields_single_rows(parquet_dir: Any) -> None:
    root, rows = parquet_dir((5, 0, 3, 9), row_group_size=4)
    loader = load(root, batch_size=1, shuffle=True)
    batches = list(loader)
    assert len(batches) == len(loader) == rows
    assert all(b["id"].shape == (1,) and b["emb"].shape == (1, 4) for b in batches)
    assert Counter(i for b in batches for i in b["id"].tolist()) == Counter(range(rows))


def test_batch_larger_than_the_dataset_is_one_batch(source: Path) -> None:
    batches = list(load(source, batch_size=ROWS + 1, shuffle=True))
    assert len(batches) == 1
    assert Counter(batches[0]["id"].tolist()) == Counter(ALL_IDS.tolist())
    assert list(load(source, batch_size=ROWS + 1, drop_last=True)) == []


@pytest.mark.parametrize("shuffle", [False, True])
def test_epochs_reshuffle_in_process(source: Path, shuffle: bool) -> None:
    loader = load(source, shuffle=shuffle)
    orders = []
    for epoch in range(3):
        loader.set_epoch(epoch)
        orders.append(read_ids(loader))
        assert Counter(orders[-1]) == Counter(ALL_IDS.tolist())
    if shuffle:
        assert orders[0] != orders[1] != orders[2] != orders[0]
    else:
        assert orders[0] == orders[1] == orders[2] == ALL_IDS.tolist()
    loader.set_epoch(1)
    assert read_ids(loader) == orders[1]


# --- empty files -----------------------------------------------------------------------------


def test_files_without_rows_contribute_nothing(parquet_dir: Any) -> None:
    root, rows = parquet_dir((0, 40, 0, 0, 25, 0), row_group_size=8)
    loader = load(root, batch_size=16, shuffle=True)
    assert len(loader) == 5
    assert Counter(read_ids(loader)) == Counter(range(rows))


def test_only_files_without_rows_read_as_nothing(parquet_dir: Any) -> None:
    root, rows = parquet_dir((0, 0))
    assert rows == 0
    loader = load(root, shuffle=True)
    assert len(loader) == 0
    assert read_ids(loader) == []


def test_a_zero_byte_file_is_corrupt(source: Path) -> None:
    (source / "part-002.parquet").write_bytes(b"")
    with pytest.raises(tdu.CorruptFileError, match=re.escape("part-002.parquet")):
        load(source)


# --- errors at construction (before any worker starts) ---------------------------------------


def build(source: Any, **options: Any) -> tdu.TabularDataLoader:
    # Two workers would start only when iterating: any error below comes from construction.
    options.setdefault("num_workers", 2)
    return tdu.create_dataloader(source, **options)


def test_missing_path(tmp_path: Path) -> None:
    missing = tmp_path / "nowhere"
    with pytest.raises(tdu.StorageNotFoundError, match="nowhere") as info:
        build(missing)
    assert isinstance(info.value, FileNotFoundError)
    with pytest.raises(FileNotFoundError, match="nowhere"):
        tdu.StructuredDataset.create_dataloader(path=str(missing), format="parquet")


def test_missing_file_in_a_list(source: Path) -> None:
    with pytest.raises(tdu.StorageNotFoundError, match=re.escape("part-999.parquet")):
        build([source / "part-000.parquet", source / "part-999.parquet"])


def test_unknown_format(source: Path) -> None:
    with pytest.raises(tdu.UnknownFormatError, match="'parq'") as info:
        build(source, format="parq")
    assert isinstance(info.value, ValueError)


@pytest.mark.parametrize("columns", [["id", "bogus"], ["bogus"]])
def test_unknown_column(source: Path, columns: list[str]) -> None:
    with pytest.raises(tdu.ColumnNotFoundError, match="bogus"):
        build(source, columns=columns)


def test_unknown_column_in_filter(source: Path) -> None:
    with pytest.raises(tdu.ColumnNotFoundError, match="bogus"):
        build(source, filters=pc.field("bogus") > 1)


@pytest.mark.parametrize("filters", ["id > 3", [("id", ">", 3)], 3])
def test_filters_must_be_an_expression(source: Path, filters: Any) -> None:
    with pytest.raises(tdu.FilterTypeError, match="Expression") as info:
        build(source, filters=filters)
    assert isinstance(info.value, TypeError)


@pytest.mark.parametrize("damage", ["garbage", "truncated", "no footer"])
def test_corrupt_file(source: Path, damage: str) -> None:
    victim = source / "part-003.parquet"
    data = victim.read_bytes()
    victim.write_bytes(
        {
            "garbage": b"not parquet " * 50,
            "truncated": data[: len(data) // 2],
            "no footer": data[:-3],
        }[damage]
    )
    with pytest.raises(tdu.CorruptFileError, match=re.escape(str(victim))) as info:
        build(source)
    assert isinstance(info.value, tdu.DataError) and isinstance(info.value, ValueError)


def test_schema_drift_names_both_files(source: Path) -> None:
    drifted = make_table(np.arange(ROWS, ROWS + 10))
    drifted = drifted.set_column(1, "x", drifted["x"].cast(pa.float64()))
    pq.write_table(drifted, source / "part-009.parquet")
    with pytest.raises(tdu.SchemaMismatchError) as info:
        build(source)
    assert str(source / "part-009.parquet") in str(info.value)
    assert str(source / "part-000.parquet") in str(info.value)
    # the drifted column is not read: no disagreement
    loader = load(source, columns=["id", "label"])
    assert Counter(read_ids(loader)) == Counter(range(ROWS + 10))


def test_schema_drift_missing_column_in_a_later_file(source: Path) -> None:
    pq.write_table(
        make_table(np.arange(ROWS, ROWS + 10)).drop_columns(["label"]), source / "part-009.parquet"
    )
    with pytest.raises(tdu.SchemaMismatchError, match=re.escape("part-009.parquet")):
        build(source)
    with pytest.raises(tdu.SchemaMismatchError, match=re.escape("part-009.parquet")):
        build(source, columns=["id", "label"])


def test_schema_drift_missing_column_in_the_first_file(source: Path) -> None:
    first = source / "part-000.parquet"
    pq.write_table(make_table(np.arange(250)).drop_columns(["label"]), first)
    with pytest.raises(tdu.SchemaMismatchError) as info:
        build(source, columns=["id", "label"])
    assert str(first) in str(info.value) and "part-001.parquet" in str(info.value)


def test_schema_drift_filter_column_missing_in_the_first_file(source: Path) -> None:
    first = source / "part-000.parquet"
    pq.write_table(make_table(np.arange(250)).drop_columns(["label"]), first)
    with pytest.raises(tdu.SchemaMismatchError) as info:
        build(source, columns=["id"], filters=pc.field("label") == 3)
    assert str(first) in str(info.value) and "part-001.parquet" in str(info.value)


@pytest.mark.parametrize(
    "options",
    [
        {"batch_size": 0},
        {"batch_size": -3},
        {"batch_size": True},
        {"batch_size": 2.5},
        {"num_workers": -1},
        {"remainder": "x"},
        {"shuffle_seed": -1},
        {"output_format": "pandas"},
        {"list_format": "ragged"},
        {"null_policy": "ignore"},
        {"partitioning": "directory"},
        {"columns": "id"},
        {"split_rows": 0},
        {"shuffle_block_size": 0},
        {"bundle_rows": -1},
        {"rank": 0},
        {"rank": 3, "world_size": 3},
        {"rank": -1, "world_size": 3},
        {"num_workers": 0, "persistent_workers": True},
    ],
    ids=repr,
)
def test_invalid_arguments(source: Path, options: dict[str, Any]) -> None:
    with pytest.raises(tdu.InvalidArgumentError) as info:
        build(source, **options)
    assert isinstance(info.value, ValueError)


def test_negative_epoch(source: Path) -> None:
    loader = load(source)
    with pytest.raises(tdu.InvalidArgumentError):
        loader.set_epoch(-1)
    assert Counter(read_ids(loader)) == Counter(ALL_IDS.tolist())


# --- explicit ranks --------------------------------------------------------------------------


def read_ranks(source: Path, world_size: int, epoch: int, **options: Any) -> list[list[list[int]]]:
    """Per rank, the ids of each batch of ``epoch``: every rank read in this process."""
    out = []
    for rank in range(world_size):
        loader = load(source, rank=rank, world_size=world_size, **options)
        loader.set_epoch(epoch)
        batches = [ids_of(b) for b in loader]
        assert len(batches) == len(loader)
        out.append(batches)
    return out


@pytest.mark.parametrize("shuffle", [False, True])
@pytest.mark.parametrize("epoch", [0, 1])
@pytest.mark.parametrize(("world_size", "batch_size"), [(3, 64), (3, 7), (4, 100), (2, 1601)])
def test_ranks_drop_partition_the_rows(
    source: Path, shuffle: bool, epoch: int, world_size: int, batch_size: int
) -> None:
    ranks = read_ranks(source, world_size, epoch, shuffle=shuffle, batch_size=batch_size)
    counts = Counter(i for batches in ranks for batch in batches for i in batch)
    assert max(counts.values(), default=1) == 1  # disjoint
    assert set(counts) <= set(ALL_IDS.tolist())
    assert len(counts) == ROWS - ROWS % world_size  # at most world_size - 1 dropped
    assert len({len(batches) for batches in ranks}) == 1  # equal batch counts
    assert len({sum(map(len, batches)) for batches in ranks}) == 1  # equal rows


def test_ranks_drop_last_gives_equal_full_batches(source: Path) -> None:
    ranks = read_ranks(source, 3, 0, shuffle=True, batch_size=100, drop_last=True)
    assert [len(b) for b in ranks] == [5, 5, 5]  # 533 rows per rank -> 5 full batches each
    counts = Counter(i for batches in ranks for batch in batches for i in batch)
    assert all(len(batch) == 100 for batches in ranks for batch in batches)
    assert max(counts.values()) == 1 and len(counts) == 1500


def test_ranks_pad_wraps_to_the_start(source: Path) -> None:
    ranks = read_ranks(source, 3, 1, shuffle=True, remainder="pad")
    counts = Counter(i for batches in ranks for batch in batches for i in batch)
    assert set(counts) == set(ALL_IDS.tolist())
    assert sum(counts.values()) == 3 * 534  # 1600 rows padded to 1602: two rows read twice
    assert sorted(counts.values())[-3:] == [1, 2, 2]
    assert len({len(batches) for batches in ranks}) == 1


def test_ranks_uneven_reads_every_row_once(source: Path) -> None:
    ranks = read_ranks(source, 3, 0, shuffle=True, remainder="uneven", batch_size=7)
    counts = Counter(i for batches in ranks for batch in batches for i in batch)
    assert counts == Counter(ALL_IDS.tolist())
    assert [sum(map(len, batches)) for batches in ranks] == [534, 533, 533]


def test_ranks_from_the_environment(source: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    explicit = read_ranks(source, 3, 0, shuffle=True)
    monkeypatch.setenv("WORLD_SIZE", "3")
    from_env = []
    for rank in range(3):
        monkeypatch.setenv("RANK", str(rank))
        from_env.append([ids_of(b) for b in load(source, shuffle=True)])
    assert from_env == explicit


# --- drop_last with filters, round_robin, filters across ranks -------------------------------


def load_with(source: Any, num_workers: int, **options: Any) -> tdu.TabularDataLoader:
    """A loader reading in process (0) or in forked worker processes."""
    options.setdefault("batch_size", BATCH)
    if num_workers:
        options.setdefault("multiprocessing_context", "fork")
        options.setdefault("timeout", 30)  # a stuck worker raises instead of hanging the run
    return tdu.create_dataloader(source, format="parquet", num_workers=num_workers, **options)


@pytest.mark.parametrize("shuffle", [False, True])
@pytest.mark.parametrize("num_workers", [0, 2])
def test_drop_last_with_a_filter_yields_only_full_batches(
    source: Path, num_workers: int, shuffle: bool
) -> None:
    loader = load_with(
        source, num_workers, filters=ID_MOD_3, drop_last=True, shuffle=shuffle, batch_size=50
    )
    sizes = batch_sizes(loader)
    assert sizes and all(n == 50 for n in sizes), sizes
    got = read_ids(loader)
    counts = Counter(got)
    assert max(counts.values()) == 1
    matching = set(ALL_IDS[ALL_IDS % 3 == 0].tolist())
    assert set(counts) <= matching
    # rows passing the filter are counted at plan time: only the rank's short tail is dropped
    assert len(counts) == len(matching) - len(matching) % 50


@pytest.mark.parametrize("num_workers", [0, 2])
def test_round_robin_drop_last_yields_full_batches_and_otherwise_every_row(
    source: Path, num_workers: int
) -> None:
    batch = 60  # 1600 rows: a short batch in every stream
    dropped = load_with(
        source,
        num_workers,
        split_strategy="round_robin",
        drop_last=True,
        shuffle=True,
        batch_size=batch,
    )
    sizes = batch_sizes(dropped)
    assert sizes and all(n == batch for n in sizes), sizes
    counts = Counter(read_ids(dropped))
    assert max(counts.values()) == 1 and set(counts) <= set(ALL_IDS.tolist())
    chunks_with_rows = sum(1 for c in dropped.dataset.plan.chunks if c.num_rows)
    streams = min(max(num_workers, 1), chunks_with_rows)
    assert ROWS - len(counts) < batch * streams  # only each stream's short tail is dropped
    kept = load_with(
        source, num_workers, split_strategy="round_robin", shuffle=True, batch_size=batch
    )
    assert Counter(read_ids(kept)) == Counter(ALL_IDS.tolist())
    for loader in (dropped, kept):
        with pytest.raises(TypeError, match="round_robin"):
            len(loader)


@pytest.mark.parametrize("remainder", ["drop", "pad", "uneven"])
@pytest.mark.parametrize("world_size", [2, 3])
def test_a_filter_across_ranks_gives_equal_ranks(
    source: Path, world_size: int, remainder: str
) -> None:
    """Rows passing the filter are counted at plan time, so ranks are cut equal as without."""
    matching = ALL_IDS[ALL_IDS % 3 == 0].tolist()
    options = {"filters": ID_MOD_3, "world_size": world_size, "remainder": remainder}
    ranks = [read_ids(load(source, rank=r, shuffle=True, **options)) for r in range(world_size)]
    sizes = [len(r) for r in ranks]
    left = len(matching) % world_size
    if remainder == "drop":
        assert sizes == [len(matching) // world_size] * world_size
        assert len(set().union(*ranks)) == sum(sizes)
        assert set().union(*ranks) <= set(matching)
    elif remainder == "pad":
        assert sizes == [-(-len(matching) // world_size)] * world_size
        assert set().union(*ranks) == set(matching)
        assert sum(sizes) - len(matching) == (world_size - left) % world_size
    else:
        assert sorted(sizes, reverse=True) == sizes and sizes[0] - sizes[-1] <= 1
        assert Counter(i for r in ranks for i in r) == Counter(matching)


def test_round_robin_across_ranks_needs_remainder_uneven(source: Path) -> None:
    with pytest.raises(tdu.InvalidArgumentError, match="round_robin"):
        build(source, split_strategy="round_robin", rank=0, world_size=2)
    ranks = [
        read_ids(
            load(
                source,
                split_strategy="round_robin",
                shuffle=True,
                rank=r,
                world_size=2,
                remainder="uneven",
            )
        )
        for r in range(2)
    ]
    assert ranks[0] and ranks[1]
    assert Counter(ranks[0] + ranks[1]) == Counter(ALL_IDS.tolist())


def test_a_filter_across_ranks_from_the_environment_is_equal(
    source: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    matching = ALL_IDS[ALL_IDS % 3 == 0].tolist()
    monkeypatch.setenv("WORLD_SIZE", "2")
    ranks = []
    for rank in range(2):
        monkeypatch.setenv("RANK", str(rank))
        ranks.append(read_ids(load(source, filters=ID_MOD_3)))
    assert [len(r) for r in ranks] == [len(matching) // 2] * 2
    assert Counter(ranks[0] + ranks[1]) <= Counter(matching)
    assert len(set(ranks[0] + ranks[1])) == len(matching) - len(matching) % 2


# --- block sizes from the decoded size of a row ----------------------------------------------


def test_block_rows_use_the_decoded_row_size(tmp_path: Path) -> None:
    rows, width = 20_000, 2000
    words = [chr(ord("a") + k) * width for k in range(8)]  # 8 distinct 2 kB strings
    ids = np.arange(rows)
    table = pa.table({"id": ids, "text": pa.array([words[i % 8] for i in ids], pa.string())})
    path = tmp_path / "wide" / "part-0.parquet"
    path.parent.mkdir()
    pq.write_table(table, path, row_group_size=5_000)  # dictionary-encoded by default
    footer = pq.ParquetFile(path).metadata
    encoded = sum(footer.row_group(g).total_byte_size for g in range(footer.num_row_groups))
    assert encoded < rows * width // 50  # the footer's size is far below the decoded size
    block_bytes = 8 * 2**20
    loader = load(path.parent, batch_size=16, shuffle=True, shuffle_block_bytes=block_bytes)
    block_rows = loader.dataset.block_rows
    assert block_rows * width <= 2 * block_bytes, block_rows
    assert block_rows * (width + 100) >= block_bytes // 2, block_rows  # yet about that size
    got = []
    for batch in load(path.parent, batch_size=4096, shuffle=True, shuffle_block_bytes=block_bytes):
        assert batch["text"] == [words[i % 8] for i in batch["id"].tolist()]
        got.extend(batch["id"].tolist())
    assert Counter(got) == Counter(ids.tolist())


# --- errors that name the file ---------------------------------------------------------------


def test_hive_key_that_is_also_a_file_column_is_a_schema_mismatch(tmp_path: Path) -> None:
    root = tmp_path / "hive"
    first = write_parquet(root / "label=1" / "part-0.parquet", np.arange(0, 20))
    write_parquet(root / "label=2" / "part-0.parquet", np.arange(20, 40))
    with pytest.raises(tdu.SchemaMismatchError, match="label") as info:
        build(root, partitioning="hive")
    assert str(first) in str(info.value)
    # without hive partitioning the same files read as they are
    assert Counter(read_ids(load(root))) == Counter(range(40))


def write_with_a_null(path: Path, ids: np.ndarray, null_at: int) -> Path:
    table = make_table(ids)
    x = table["x"].to_pylist()
    x[null_at] = None
    table = table.set_column(1, "x", pa.array(x, pa.float32()))
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(table, path, row_group_size=100)
    return path


@pytest.mark.parametrize("num_workers", [0, 2])
def test_a_null_in_a_numeric_column_names_the_file(source: Path, num_workers: int) -> None:
    victim = write_with_a_null(source / "part-003.parquet", np.arange(1250, 1583), null_at=200)
    loader = load_with(source, num_workers, shuffle=True)
    error = first_error(loader)
    assert isinstance(error, tdu.NullValueError), type(error)
    assert isinstance(error, tdu.DataError) and isinstance(error, ValueError)
    assert str(victim) in str(error)
    assert "'x'" in str(error)
    # the other policies read every row
    fill = load_with(source, num_workers, null_policy="fill")
    assert Counter(read_ids(fill)) == Counter(ALL_IDS.tolist())


NULL_ID = 1450  # write_with_a_null(part-003, null_at=200): ids 1250.. in that file


@pytest.mark.parametrize(
    ("expression", "mask"),
    [
        (pc.field("x").is_valid(), lambda i: i != NULL_ID),
        (pc.field("x") > 1.0, lambda i: (i != NULL_ID) & (i * 0.5 > 1.0)),
        (pc.field("id") != NULL_ID, lambda i: i != NULL_ID),
    ],
    ids=["is_valid", "comparison", "other column"],
)
def test_nulls_the_filter_removes_are_no_error(
    source: Path, expression: pc.Expression, mask: IdsMask
) -> None:
    write_with_a_null(source / "part-003.parquet", np.arange(1250, 1583), null_at=200)
    got = read_ids(load(source, filters=expression))
    assert Counter(got) == Counter(ALL_IDS[mask(ALL_IDS)].tolist())


def test_a_null_in_an_unread_column_is_no_error(source: Path) -> None:
    write_with_a_null(source / "part-003.parquet", np.arange(1250, 1583), null_at=5)
    assert Counter(read_ids(load(source, columns=["id", "label"]))) == Counter(ALL_IDS.tolist())


@pytest.mark.parametrize("string_file", ["part-009.parquet", "part-000.parquet"])
def test_filter_column_whose_type_differs_between_files_is_a_schema_mismatch(
    source: Path, string_file: str
) -> None:
    victim = source / string_file
    ids = pq.read_table(victim, columns=["id"])["id"].to_numpy() if victim.exists() else None
    drifted = make_table(np.arange(ROWS, ROWS + 10) if ids is None else ids)
    drifted = drifted.set_column(1, "x", drifted["x"].cast(pa.string()))  # float32 elsewhere
    pq.write_table(drifted, victim)
    for columns in (None, ["id"]):
        with pytest.raises(tdu.SchemaMismatchError) as info:
            build(source, columns=columns, filters=pc.field("x") < 100.25)
        assert not isinstance(info.value, tdu.CorruptFileError)
        assert str(victim) in str(info.value)
