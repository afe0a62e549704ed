"""Columns resolved by field id: renamed and added columns, promoted types, and files written
without field ids (read through the table's name mapping)."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from pyiceberg.types import DoubleType, LongType

from tests.conftest import first_error
from tests.iceberg.conftest import GROUP_ROWS, Catalog, batch_ids, flat, loader, rows
from torch_dataloader_utils import NullValueError

pytestmark = [
    pytest.mark.timeout(120),
    pytest.mark.filterwarnings("ignore:This DataLoader will create:UserWarning"),
]


def read_all(catalog: Catalog, name: str, **options: object) -> pa.Table:
    load, _ = loader(catalog, name, output_format="arrow", num_workers=2, **options)
    table = pa.Table.from_batches(list(load))
    return table.sort_by("id")


def test_renamed_column_reads_from_old_and_new_files(catalog: Catalog) -> None:
    table = catalog.create("ren", [range(0, 300)])
    first = table.current_snapshot().snapshot_id
    with table.update_schema() as update:
        update.rename_column("x", "score")
    table.append(rows(range(300, 500)).rename_columns(["id", "score", "label", "name"]))
    got = read_all(catalog, "ren", columns=["id", "score"])
    assert got.schema.names == ["id", "score"]
    assert np.array_equal(got["score"].to_numpy(), np.arange(500) / 2)
    filtered = read_all(catalog, "ren", filters=pc.field("score") >= 200)
    assert filtered["id"].to_pylist() == list(range(400, 500))
    # Time travel reads the snapshot's own schema: the old name.
    old = read_all(catalog, "ren", snapshot_id=first)
    assert "x" in old.schema.names and "score" not in old.schema.names
    assert old.num_rows == 300


def test_added_column_is_null_in_older_files(catalog: Catalog) -> None:
    table = catalog.create("add", [range(0, 250)])
    with table.update_schema() as update:
        update.add_column("extra", LongType())
    new = rows(range(250, 400)).append_column("extra", pa.array(np.arange(250, 400) * 3))
    table.append(new)
    got = read_all(catalog, "add")
    extra = got["extra"].to_pylist()
    assert extra[:250] == [None] * 250
    assert extra[250:] == [i * 3 for i in range(250, 400)]
    # Reading only the added column: older files decode no column at all, yet keep their rows.
    load, _ = loader(catalog, "add", columns=["extra"], output_format="arrow")
    assert sum(b.num_rows for b in load) == 400
    # The default null policy refuses nulls into tensors, naming the column; "fill" takes them.
    load, _ = loader(catalog, "add", columns=["id", "extra"])
    error = first_error(load)
    assert isinstance(error, NullValueError) and "'extra'" in str(error)
    load, _ = loader(catalog, "add", columns=["id", "extra"], null_policy="fill")
    assert sorted(flat(batch_ids(load))) == list(range(400))


def test_promoted_types(catalog: Catalog) -> None:
    schema = pa.schema([("id", pa.int64()), ("v", pa.int32()), ("f", pa.float32())])
    table = catalog.create("promo", schema=schema)
    ids = np.arange(300)
    table.append(
        pa.table(
            {"id": ids, "v": ids.astype(np.int32), "f": (ids / 4).astype(np.float32)},
            schema=schema,
        )
    )
    with table.update_schema() as update:
        update.update_column("v", LongType())
        update.update_column("f", DoubleType())
    more = np.arange(300, 400)
    table.append(pa.table({"id": more, "v": more * 10**10, "f": more / 4}))
    got = read_all(catalog, "promo")
    assert got.schema.field("v").type == pa.int64() and got.schema.field("f").type == pa.float64()
    assert got["v"].to_pylist() == [*range(300), *(i * 10**10 for i in range(300, 400))]
    assert np.array_equal(got["f"].to_numpy(), np.arange(400) / 4)
    big = read_all(catalog, "promo", filters=pc.field("v") > 2**40)
    assert big["id"].to_pylist() == list(range(300, 400))


def test_files_without_field_ids_through_the_name_mapping(catalog: Catalog) -> None:
    table = catalog.create("added")
    paths = []
    for k, part in enumerate([range(0, 450), range(450, 600)]):
        path = catalog.root / f"external-{k}.parquet"
        pq.write_table(rows(part), path, row_group_size=GROUP_ROWS)  # no field ids
        assert pq.read_schema(path).field("id").metadata is None
        paths.append(f"file://{path}")
    table.add_files(paths)
    assert table.refresh().metadata.name_mapping() is not None
    load, dataset = loader(catalog, "added", num_workers=2, shuffle=True)
    assert len(dataset.plan.chunks) == 5 + 2  # row-group chunks of the added files
    assert sorted(flat(batch_ids(load))) == list(range(600))
    with table.update_schema() as update:
        update.rename_column("label", "klass")
    got = read_all(catalog, "added", columns=["id", "klass"])
    assert got["klass"].to_pylist() == [i % 7 for i in range(600)]
