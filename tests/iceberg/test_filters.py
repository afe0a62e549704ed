"""Filters of all three kinds (pyarrow expression, pyiceberg expression, pyiceberg string):
the same rows, files pruned at plan time, rows filtered when read."""

from __future__ import annotations

from collections import Counter

import pyarrow as pa
import pyarrow.compute as pc
import pytest
from pyiceberg.expressions import And, GreaterThanOrEqual, LessThan
from pyiceberg.partitioning import PartitionField, PartitionSpec
from pyiceberg.schema import Schema
from pyiceberg.transforms import IdentityTransform
from pyiceberg.types import DoubleType, LongType, NestedField, StringType

from tests.iceberg.conftest import Catalog, batch_ids, flat, loader, rows
from torch_dataloader_utils import ColumnNotFoundError, FilterTypeError

pytestmark = [
    pytest.mark.timeout(120),
    pytest.mark.filterwarnings("ignore:This DataLoader will create:UserWarning"),
]

# Four files of 500 ids each: a filter on id prunes by the files' column bounds.
PARTS = [range(k * 500, (k + 1) * 500) for k in range(4)]
LOW, HIGH = 620, 910  # inside the second file only

FILTERS = {
    "pyarrow": (pc.field("id") >= LOW) & (pc.field("id") < HIGH),
    "pyiceberg": And(GreaterThanOrEqual("id", LOW), LessThan("id", HIGH)),
    "string": f"id >= {LOW} and id < {HIGH}",
}


@pytest.fixture
def table(catalog: Catalog) -> str:
    catalog.create("events", PARTS)
    return "events"


@pytest.mark.parametrize("kind", list(FILTERS))
def test_each_kind_prunes_files_and_filters_rows(catalog: Catalog, table: str, kind: str) -> None:
    load, dataset = loader(catalog, table, filters=FILTERS[kind], num_workers=2, shuffle=True)
    assert len({c.path for c in dataset.plan.chunks}) == 1  # three of four files pruned
    assert len(dataset.plan.chunks) == 5  # that file's row groups
    assert dataset.plan.num_rows == HIGH - LOW  # rows counted after the filter
    batches = batch_ids(load)
    assert Counter(flat(batches)) == Counter(range(LOW, HIGH))
    assert len(batches) == len(load)


def test_unprunable_filter_still_filters_rows(catalog: Catalog, table: str) -> None:
    # label = id % 7: every file has every label, nothing is pruned, rows are filtered.
    load, dataset = loader(catalog, table, filters=pc.field("label") == 3, num_workers=2)
    assert len({c.path for c in dataset.plan.chunks}) == 4
    assert sorted(flat(batch_ids(load))) == [i for i in range(2000) if i % 7 == 3]


def test_filter_column_not_read_out(catalog: Catalog, table: str) -> None:
    load, dataset = loader(
        catalog, table, filters="label = 3 and id < 100", columns=["id"], output_format="arrow"
    )
    assert dataset.plan.schema.names == ["id"]
    batches = list(load)
    assert all(b.schema.names == ["id"] for b in batches)
    assert sorted(i for b in batches for i in b["id"].to_pylist()) == [3, 10, 17, 24] + [
        i for i in range(31, 100, 7)
    ]


def test_partitions_are_pruned(catalog: Catalog) -> None:
    schema = Schema(
        NestedField(1, "id", LongType(), required=False),
        NestedField(2, "x", DoubleType(), required=False),
        NestedField(3, "label", LongType(), required=False),
        NestedField(4, "name", StringType(), required=False),
    )
    spec = PartitionSpec(PartitionField(3, 1000, IdentityTransform(), "label"))
    table = catalog.create("parted", schema=schema, partition_spec=spec)
    table.append(rows(range(700)))  # seven partitions, one file each
    load, dataset = loader(catalog, "parted", filters=pc.field("label").isin([2, 5]))
    assert len({c.path for c in dataset.plan.chunks}) == 2
    assert sorted(flat(batch_ids(load))) == [i for i in range(700) if i % 7 in (2, 5)]


def test_unknown_column_in_filter(catalog: Catalog, table: str) -> None:
    for filters in (pc.field("nope") > 1, "nope > 1"):
        with pytest.raises(ColumnNotFoundError):
            loader(catalog, table, filters=filters)


def test_wrong_filter_type(catalog: Catalog, table: str) -> None:
    with pytest.raises(FilterTypeError):
        loader(catalog, table, filters=[("id", ">", 1)])


def test_unknown_column(catalog: Catalog, table: str) -> None:
    with pytest.raises(ColumnNotFoundError, match=r"db\.events"):
        loader(catalog, table, columns=["id", "nope"])


def test_filter_with_workers_and_no_match(catalog: Catalog, table: str) -> None:
    load, dataset = loader(catalog, table, filters="id > 100000", num_workers=2)
    assert dataset.plan.num_rows == 0 and not dataset.plan.chunks
    assert batch_ids(load) == []


def test_the_fingerprint_knows_the_filter_in_a_canonical_form(catalog: Catalog, table: str) -> None:
    # pyiceberg keeps set literals in a set: the pyarrow expression converted from it lists them
    # in hash order, which differs between processes; the fingerprint must not.
    _, one = loader(catalog, table, filters="name in ('row-1', 'row-2', 'row-3', 'row-4')")
    _, two = loader(catalog, table, filters="name in ('row-4', 'row-3', 'row-2', 'row-1')")
    assert one.plan.fingerprint == two.plan.fingerprint
    assert dict(one.plan.details)["filter"].startswith("In(Reference(name='name')")
    _, arrow = loader(catalog, table, filters=pc.field("id") > 3)
    assert dict(arrow.plan.details)["filter"] == str(pc.field("id") > 3)


def test_a_filter_pyiceberg_cannot_prune_with_still_filters_rows(
    catalog: Catalog, caplog: pytest.LogCaptureFixture
) -> None:
    # pyiceberg 0.12 raises TypeError evaluating "label > 1 or label is null" against a null
    # identity-partition value (apache/iceberg-python#3498): the read plans every file instead.
    schema = Schema(
        NestedField(1, "id", LongType(), required=False),
        NestedField(2, "x", DoubleType(), required=False),
        NestedField(3, "label", LongType(), required=False),
        NestedField(4, "name", StringType(), required=False),
    )
    spec = PartitionSpec(PartitionField(3, 1000, IdentityTransform(), "label"))
    table = catalog.create("nulls", schema=schema, partition_spec=spec)
    data = rows(range(70))
    labels = [None if i % 7 == 0 else i % 7 for i in range(70)]
    table.append(data.set_column(2, "label", pa.array(labels, pa.int64())))
    for filters in (
        "label > 1 or label is null",
        (pc.field("label") > 1) | pc.field("label").is_null(),
    ):
        caplog.clear()
        with caplog.at_level("WARNING", logger="torch_dataloader_utils.iceberg.scan"):
            load, _ = loader(catalog, "nulls", filters=filters, null_policy="mask")
        assert "could not prune files" in caplog.text  # the pyiceberg bug was hit
        got = flat(batch_ids(load))
        assert Counter(got) == Counter(i for i in range(70) if i % 7 != 1)
