"""Iceberg tables for tests: a SQLite SQL catalog per test, tables made of small row groups,
and hand-written delete files committed the way an engine would (pyiceberg cannot write them).

Rows are identified by ``id``; values are functions of it, so a test checks content from ids.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

pytest.importorskip("pyiceberg")

from pyiceberg.catalog.sql import SqlCatalog
from pyiceberg.manifest import (
    DataFile,
    DataFileContent,
    FileFormat,
    ManifestContent,
    ManifestEntry,
    ManifestEntryStatus,
    ManifestFile,
    ManifestWriterV2,
)
from pyiceberg.table import Table
from pyiceberg.table.snapshots import Operation
from pyiceberg.table.update.snapshot import _FastAppendFiles
from pyiceberg.typedef import Record

import torch_dataloader_utils as tdu

CATALOG = "tdu"
NAMESPACE = "db"
GROUP_ROWS = 100  # rows per Parquet row group of every data file the tests write

# Field ids of the position-delete file columns (Iceberg spec).
FILE_PATH_ID = 2147483546
POS_ID = 2147483545


def rows(ids: Sequence[int] | np.ndarray) -> pa.Table:
    """Rows with ``id``; ``x`` = id / 2 (float), ``label`` = id % 7, ``name`` = "row-<id>"."""
    ids = np.asarray(ids, dtype=np.int64)
    return pa.table(
        {
            "id": pa.array(ids, pa.int64()),
            "x": pa.array(ids / 2, pa.float64()),
            "label": pa.array(ids % 7, pa.int64()),
            "name": pa.array([f"row-{i}" for i in ids], pa.string()),
        }
    )


@dataclass
class Catalog:
    """A SQLite-backed SQL catalog and the ``catalog_config`` that loads it by name."""

    catalog: SqlCatalog
    config: dict[str, str]
    root: Path

    def create(
        self,
        name: str,
        parts: Iterable[Sequence[int] | np.ndarray] = (),
        *,
        schema: pa.Schema | None = None,
        properties: Mapping[str, str] | None = None,
        **kwargs: Any,
    ) -> Table:
        """A table ``db.<name>``; each of ``parts`` is appended as its own data file (and
        snapshot), in row groups of GROUP_ROWS rows."""
        props = {"write.parquet.row-group-limit": str(GROUP_ROWS), **(properties or {})}
        table = self.catalog.create_table(
            f"{NAMESPACE}.{name}", schema=schema or rows([]).schema, properties=props, **kwargs
        )
        for ids in parts:
            table.append(rows(ids))
        return table

    def load(self, name: str) -> Table:
        return self.catalog.load_table(f"{NAMESPACE}.{name}")


@pytest.fixture
def catalog(tmp_path: Path) -> Catalog:
    """A fresh catalog: ``sqlite:///<tmp>/catalog.db``, warehouse ``file:///<tmp>/wh``."""
    config = {
        "type": "sql",
        "uri": f"sqlite:///{tmp_path}/catalog.db",
        "warehouse": f"file://{tmp_path}/wh",
    }
    sql = SqlCatalog(CATALOG, uri=config["uri"], warehouse=config["warehouse"])
    sql.create_namespace(NAMESPACE)
    return Catalog(sql, {"name": CATALOG, **config}, tmp_path)


def loader(
    catalog: Catalog, name: str, **options: Any
) -> tuple[tdu.TabularDataLoader, tdu.IcebergDataset]:
    """``IcebergDataset.create_dataloader`` of ``db.<name>``, workers forked by default, with a
    timeout so that a stuck worker fails the test instead of hanging it."""
    options.setdefault("batch_size", 64)
    options.setdefault("num_workers", 0)
    if options["num_workers"]:
        options.setdefault("multiprocessing_context", "fork")
        options.setdefault("timeout", 60)
    return tdu.IcebergDataset.create_dataloader(
        table=f"{NAMESPACE}.{name}", catalog_config=catalog.config, **options
    )


def batch_ids(loader: Any) -> list[list[int]]:
    """The ids of each batch of one pass over ``loader``."""
    out = []
    for batch in loader:
        column = batch["id"]
        for convert in ("tolist", "to_pylist"):  # tensor or numpy; arrow
            if hasattr(column, convert):
                column = getattr(column, convert)()
        out.append([int(i) for i in column])
    return out


def flat(batches: Iterable[Sequence[int]]) -> list[int]:
    return [i for batch in batches for i in batch]


def data_files(table: Table) -> list[DataFile]:
    """The data files of the table's current snapshot, by path."""
    return sorted((t.file for t in table.scan().plan_files()), key=lambda f: f.file_path)


# --- committing delete files ------------------------------------------------------------------


class _DeleteManifestWriter(ManifestWriterV2):
    """A v2 manifest of delete files (pyiceberg writes data manifests only)."""

    def content(self) -> ManifestContent:
        return ManifestContent.DELETES

    @property
    def _meta(self) -> dict[str, str]:
        return {**super()._meta, "content": "deletes"}


class _AddDeleteFiles(_FastAppendFiles):
    """A ``delete`` snapshot that adds delete files in one DELETES manifest, keeping every
    existing manifest (what an engine's merge-on-read DELETE commits)."""

    def __init__(self, delete_files: list[DataFile], **kwargs: Any) -> None:
        super().__init__(Operation.DELETE, **kwargs)
        self._delete_files = delete_files

    def _manifests(self) -> list[ManifestFile]:
        metadata = self._transaction.table_metadata
        writer = _DeleteManifestWriter(
            metadata.spec(),
            metadata.schema(),
            self.new_manifest_output(),
            self._snapshot_id,
            self._compression,
        )
        with writer:
            for delete_file in self._delete_files:
                writer.add(
                    ManifestEntry.from_args(
                        status=ManifestEntryStatus.ADDED,
                        snapshot_id=self._snapshot_id,
                        sequence_number=None,
                        file_sequence_number=None,
                        data_file=delete_file,
                    )
                )
        return [writer.to_manifest_file(), *self._existing_manifests()]


def _commit_delete_files(table: Table, files: list[DataFile]) -> Table:
    transaction = table.transaction()
    _AddDeleteFiles(files, transaction=transaction, io=table.io).commit()
    transaction.commit_transaction()
    return table.refresh()


def _write(table: Table, location: str, data: pa.Table, **options: Any) -> int:
    """Write ``data`` as Parquet at ``location`` through the table's FileIO (local or S3);
    returns the file's size."""
    with table.io.new_output(location).create(overwrite=True) as out:
        pq.write_table(data, out, **options)
    return len(table.io.new_input(location))


def commit_position_deletes(
    table: Table, deletes: Mapping[str, Sequence[int]], *, row_group_size: int = 2
) -> Table:
    """Commit one position-delete file deleting ``deletes`` (data file URL -> positions),
    sorted by path and position as the spec asks, in tiny row groups (so its file_path column
    is read from several chunks). Returns the refreshed table."""
    pairs = sorted((path, int(p)) for path, positions in deletes.items() for p in positions)
    schema = pa.schema(
        [
            pa.field("file_path", pa.string(), False, {"PARQUET:field_id": str(FILE_PATH_ID)}),
            pa.field("pos", pa.int64(), False, {"PARQUET:field_id": str(POS_ID)}),
        ]
    )
    location = f"{table.metadata.location}/data/delete-{uuid.uuid4().hex}.parquet"
    data = pa.table({"file_path": [p for p, _ in pairs], "pos": [q for _, q in pairs]}, schema)
    size = _write(table, location, data, row_group_size=row_group_size)
    delete_file = DataFile.from_args(
        content=DataFileContent.POSITION_DELETES,
        file_path=location,
        file_format=FileFormat.PARQUET,
        partition=Record(),
        record_count=len(pairs),
        file_size_in_bytes=size,
        _table_format_version=2,
    )
    return _commit_delete_files(table, [delete_file])


def commit_equality_deletes(table: Table, ids: Sequence[int]) -> Table:
    """Commit one equality-delete file deleting rows by ``id`` (field id 1)."""
    location = f"{table.metadata.location}/data/eq-delete-{uuid.uuid4().hex}.parquet"
    field = pa.field("id", pa.int64(), False, {"PARQUET:field_id": "1"})
    data = pa.table({"id": pa.array(ids, pa.int64())}, pa.schema([field]))
    size = _write(table, location, data)
    delete_file = DataFile.from_args(
        content=DataFileContent.EQUALITY_DELETES,
        file_path=location,
        file_format=FileFormat.PARQUET,
        partition=Record(),
        record_count=len(ids),
        file_size_in_bytes=size,
        equality_ids=[1],
        _table_format_version=2,
    )
    return _commit_delete_files(table, [delete_file])
