"""Iceberg tables for tests: a SQLite SQL catalog per test, tables made of small row groups,
and hand-written delete files committed the way an engine would (pyiceberg cannot write them).

Rows are identified by ``id``; values are functions of it, so a test checks content from ids.
"""

from __future__ import annotations

import json
import uuid
import zlib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

pytest.importorskip("pyiceberg")

from pyiceberg.avro.file import AvroOutputFile
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
from pyiceberg.typedef import Record, TableVersion

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

    manifest_writer: type[_DeleteManifestWriter] = _DeleteManifestWriter

    def __init__(self, delete_files: list[DataFile], **kwargs: Any) -> None:
        super().__init__(Operation.DELETE, **kwargs)
        self._delete_files = delete_files

    def _manifests(self) -> list[ManifestFile]:
        metadata = self._transaction.table_metadata
        writer = self.manifest_writer(
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


# --- format version 3: deletion vectors ---------------------------------------------------------
# pyiceberg 0.12 reads format version 3 tables but writes neither their metadata nor their
# manifests: a table is written as version 2, its deletion vectors committed in a version 3
# manifest, and its metadata then rewritten as version 3 (`upgrade_to_v3`).

PUFFIN_MAGIC = b"PFA1"
DV_MAGIC = b"\xd1\xd3\x39\x64"
DV_FIELD_ID = 2147483645  # the blob's field: the reserved _pos field (Puffin spec)


def new_catalog(root: Path) -> Catalog:
    """A catalog as the ``catalog`` fixture makes it, under ``root`` (for module fixtures)."""
    config = {
        "type": "sql",
        "uri": f"sqlite:///{root}/catalog.db",
        "warehouse": f"file://{root}/wh",
    }
    sql = SqlCatalog(CATALOG, uri=config["uri"], warehouse=config["warehouse"])
    sql.create_namespace(NAMESPACE)
    return Catalog(sql, {"name": CATALOG, **config}, root)


def dv_blob(positions: Iterable[int]) -> bytes:
    """A ``deletion-vector-v1`` blob (Puffin spec), written by hand: the big-endian length of
    magic + bitmap, the magic, the portable 64-bit roaring bitmap (an 8-byte little-endian
    count of 32-bit bitmaps, then each one's 4-byte little-endian high key and portable
    RoaringBitmap), and the big-endian CRC-32 of magic + bitmap."""
    from pyroaring import BitMap

    highs: dict[int, list[int]] = {}
    for p in sorted(set(int(p) for p in positions)):
        highs.setdefault(p >> 32, []).append(p & 0xFFFFFFFF)
    bitmap = len(highs).to_bytes(8, "little")
    for key in sorted(highs):
        bitmap += key.to_bytes(4, "little") + BitMap(highs[key]).serialize()
    data = DV_MAGIC + bitmap
    return len(data).to_bytes(4, "big") + data + zlib.crc32(data).to_bytes(4, "big")


@dataclass(frozen=True)
class Blob:
    """A deletion vector written in a Puffin file."""

    data_file: str
    offset: int
    length: int
    cardinality: int


def write_puffin(table: Table, deletes: Mapping[str, Sequence[int]]) -> tuple[str, int, list[Blob]]:
    """A Puffin file (spec: magic, blobs, then the footer: magic, JSON payload, its 4-byte
    little-endian length, 4 flag bytes, magic) of one deletion vector per data file URL of
    ``deletes``, in that order (the first blob at offset 4). Returns its location, size and
    blobs."""
    body = bytearray(PUFFIN_MAGIC)
    blobs, metadata = [], []
    for data_file, positions in deletes.items():
        blob = dv_blob(positions)
        cardinality = len(set(positions))
        blobs.append(Blob(data_file, len(body), len(blob), cardinality))
        metadata.append(
            {
                "type": "deletion-vector-v1",
                "fields": [DV_FIELD_ID],
                "snapshot-id": -1,  # the spec's value for vectors: inherited
                "sequence-number": -1,
                "offset": len(body),
                "length": len(blob),
                "properties": {
                    "referenced-data-file": data_file,
                    "cardinality": str(cardinality),
                },
            }
        )
        body += blob
    footer = json.dumps({"blobs": metadata, "properties": {"created-by": "tdu tests"}}).encode()
    body += PUFFIN_MAGIC + footer + len(footer).to_bytes(4, "little") + bytes(4) + PUFFIN_MAGIC
    location = f"{table.metadata.location}/data/dv-{uuid.uuid4().hex}.puffin"
    with table.io.new_output(location).create(overwrite=True) as out:
        out.write(bytes(body))
    return location, len(body), blobs


class _DeletionVectorManifestWriter(_DeleteManifestWriter):
    """A version 3 manifest of delete files: entries keep the fields that locate a vector."""

    @property
    def version(self) -> TableVersion:
        return 3

    def new_writer(self) -> AvroOutputFile[ManifestEntry]:
        schema = self._with_partition(3)
        return AvroOutputFile[ManifestEntry](
            output_file=self._output_file,
            file_schema=schema,
            record_schema=schema,
            schema_name="manifest_entry",
            metadata=self._meta,
        )


class _AddDeletionVectors(_AddDeleteFiles):
    """`_AddDeleteFiles` with the delete files in a version 3 manifest."""

    manifest_writer = _DeletionVectorManifestWriter


def commit_deletion_vectors(
    table: Table, deletes: Mapping[str, Sequence[int]]
) -> tuple[Table, str, list[Blob]]:
    """Commit one Puffin file (`write_puffin`) with a deletion vector per data file URL of
    ``deletes``, an entry per vector as an engine commits them (``POSITION_DELETES``,
    ``PUFFIN``, ``referenced_data_file``, ``content_offset``, ``content_size_in_bytes``,
    ``record_count`` = cardinality). Returns the refreshed table, the file and its blobs."""
    location, size, blobs = write_puffin(table, deletes)
    files = [
        DataFile.from_args(
            content=DataFileContent.POSITION_DELETES,
            file_path=location,
            file_format=FileFormat.PUFFIN,
            partition=Record(),
            record_count=blob.cardinality,
            file_size_in_bytes=size,
            referenced_data_file=blob.data_file,
            content_offset=blob.offset,
            content_size_in_bytes=blob.length,
            _table_format_version=3,
        )
        for blob in blobs
    ]
    transaction = table.transaction()
    _AddDeletionVectors(files, transaction=transaction, io=table.io).commit()
    transaction.commit_transaction()
    return table.refresh(), location, blobs


def upgrade_to_v3(catalog: Catalog, name: str) -> Table:
    """Rewrite ``db.<name>``'s current metadata as format version 3 (row lineage: each
    snapshot's ``first-row-id`` and ``added-rows``, the table's ``next-row-id``) and register
    it in place of the table. No commit through pyiceberg is possible afterwards."""
    table = catalog.load(name)
    with table.io.new_input(table.metadata_location).open() as source:
        metadata = json.loads(source.read())
    metadata["format-version"] = 3
    next_row_id = 0
    for snapshot in sorted(metadata.get("snapshots", []), key=lambda s: s["sequence-number"]):
        summary = snapshot.get("summary", {})
        added = int(summary.get("added-records", 0)) if summary.get("operation") == "append" else 0
        snapshot["first-row-id"], snapshot["added-rows"] = next_row_id, added
        next_row_id += added
    metadata["next-row-id"] = next_row_id
    location = table.metadata_location.replace(".metadata.json", "-v3.metadata.json")
    with table.io.new_output(location).create(overwrite=True) as out:
        out.write(json.dumps(metadata).encode())
    catalog.catalog.drop_table(f"{NAMESPACE}.{name}")  # (the row only: files stay)
    return catalog.catalog.register_table(f"{NAMESPACE}.{name}", location)
