"""Delta tables the tests read: written by deltalake (appends, overwrites, checkpoints) or BY HAND
as PROTOCOL.md specifies, for what delta-rs cannot write: deletion vectors (inline and in files)
and column mapping (``name`` and ``id``). Rows are identified by ``id``; ``tokens`` holds a list
of integers per row (for packing)."""

from __future__ import annotations

import json
import os
import uuid
import zlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

MAGIC = (1681511377).to_bytes(4, "little")
Z85 = "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ.-:+=^!/*?&<>()[]{}@%$#"


def z85_encode(data: bytes) -> str:
    """Z85 of ``data`` zero-padded to a multiple of 4 bytes (as Delta encodes)."""
    data = data + b"\0" * (-len(data) % 4)
    out = []
    for i in range(0, len(data), 4):
        value = int.from_bytes(data[i : i + 4], "big")
        chars = []
        for _ in range(5):
            value, digit = divmod(value, 85)
            chars.append(Z85[digit])
        out.append("".join(reversed(chars)))
    return "".join(out)


def dv_bytes(positions: Sequence[int]) -> bytes:
    """A deletion vector's magic + portable 64-bit roaring bitmap."""
    from pyroaring import BitMap64

    return MAGIC + BitMap64(list(positions)).serialize()


def framed(data: bytes, *, bad_crc: bool = False) -> bytes:
    """Size (BE) + data + CRC-32 (BE), as a vector sits in a deletion vector file."""
    crc = zlib.crc32(data) ^ (1 if bad_crc else 0)
    return len(data).to_bytes(4, "big") + data + crc.to_bytes(4, "big")


def make_rows(ids: Sequence[int]) -> dict[str, pa.Array]:
    """Columns of rows ``ids``: id, label (id % 7), name, score, tokens (id % 5 + 1 tokens)."""
    values = np.asarray(ids, dtype=np.int64)
    return {
        "id": pa.array(values, pa.int64()),
        "label": pa.array(values % 7, pa.int32()),
        "name": pa.array([f"row-{i}" for i in values], pa.string()),
        "score": pa.array(values * 0.5, pa.float64()),
        "tokens": pa.array(
            [list(range(i, i + i % 5 + 1)) for i in values.tolist()], pa.list_(pa.int64())
        ),
    }


_DELTA_TYPES = {
    pa.int64(): "long",
    pa.int32(): "integer",
    pa.string(): "string",
    pa.float64(): "double",
    pa.date32(): "date",
}


def _delta_type(t: pa.DataType) -> Any:
    if pa.types.is_list(t):
        return {"type": "array", "elementType": _delta_type(t.value_type), "containsNull": True}
    return _DELTA_TYPES[t]


@dataclass
class HandTable:
    """A Delta table written by hand: protocol, metadata and add actions (with deletion vector
    descriptors), Parquet files under physical names with field ids in column mapping mode.

    Attributes:
        root: the table's folder.
        mode: column mapping: ``None``, ``"name"`` or ``"id"``.
        partition_by: partition columns (not in the data files).
        reader_features: the protocol's reader features (``None``: those the table uses).
        nested: add a struct column ``meta`` {a: id * 2, b: "m<id>"} (its fields mapped too).
    """

    root: Path
    mode: str | None = None
    partition_by: tuple[str, ...] = ()
    reader_features: list[str] | None = None
    nested: bool = False
    version: int = -1
    types: dict[str, pa.DataType] = field(default_factory=dict)
    _live: dict[str, list[int]] = field(default_factory=dict)  # file -> live ids

    def physical(self, name: str) -> str:
        """The column's name in data files and in the log's stats and partition values."""
        leaf = name.rsplit(".", 1)[-1]
        return f"col-{self.ids()[name]}-{leaf}" if self.mode else leaf

    def ids(self) -> dict[str, int]:
        """Column mapping ids: the top-level columns', then ``meta``'s fields'."""
        names = [*self.types, *(["meta.a", "meta.b"] if self.nested else [])]
        return {n: i + 1 for i, n in enumerate(names)}

    def _id(self, name: str) -> dict[bytes, bytes] | None:
        return {b"PARQUET:field_id": str(self.ids()[name]).encode()} if self.mode else None

    def _meta(self, name: str) -> dict[str, Any]:
        if not self.mode:
            return {}
        return {
            "delta.columnMapping.id": self.ids()[name],
            "delta.columnMapping.physicalName": self.physical(name),
        }

    def _schema_json(self) -> str:
        fields = []
        for name, t in self.types.items():
            if name != "meta":
                typ = _delta_type(t)
            else:
                inner = [("a", "long"), ("b", "string")]
                typ = {
                    "type": "struct",
                    "fields": [
                        {
                            "name": n,
                            "type": k,
                            "nullable": True,
                            "metadata": self._meta(f"meta.{n}"),
                        }
                        for n, k in inner
                    ],
                }
            fields.append(
                {"name": name, "type": typ, "nullable": True, "metadata": self._meta(name)}
            )
        return json.dumps({"type": "struct", "fields": fields})

    def _actions_of_first_commit(self) -> list[dict[str, Any]]:
        features = ["deletionVectors", *(["columnMapping"] if self.mode else [])]
        if self.reader_features is not None:
            features = self.reader_features
        config = {"delta.enableDeletionVectors": "true"}
        if self.mode:
            config["delta.columnMapping.mode"] = self.mode
            config["delta.columnMapping.maxColumnId"] = str(len(self.ids()))
        return [
            {
                "protocol": {
                    "minReaderVersion": 3,
                    "minWriterVersion": 7,
                    "readerFeatures": features,
                    "writerFeatures": features,
                }
            },
            {
                "metaData": {
                    "id": str(uuid.uuid4()),
                    "format": {"provider": "parquet", "options": {}},
                    "schemaString": self._schema_json(),
                    "partitionColumns": list(self.partition_by),
                    "configuration": config,
                    "createdTime": 1_700_000_000_000,
                }
            },
        ]

    def write_file(
        self, name: str, ids: Sequence[int], *, row_group_size: int, partition: Any = None
    ) -> dict[str, Any]:
        """Write a data file of rows ``ids`` (partition columns left out); its add action."""
        columns = make_rows(ids)
        if self.nested:
            doubled = np.asarray(ids, dtype=np.int64) * 2
            columns["meta"] = pa.StructArray.from_arrays(
                [pa.array(doubled), pa.array([f"m{i}" for i in ids])],
                names=["a", "b"],
            )
        if not self.types:
            self.types = {n: a.type for n, a in columns.items()}
        data_fields, arrays = [], []
        for column, array in columns.items():
            if column in self.partition_by:
                continue
            if column == "meta" and self.mode:  # its fields under their physical names and ids
                fields = [
                    pa.field(
                        self.physical(f"meta.{n}"),
                        array.type.field(n).type,
                        metadata=self._id(f"meta.{n}"),
                    )
                    for n in ("a", "b")
                ]
                arrays.append(pa.StructArray.from_arrays(array.flatten(), fields=fields))
            else:
                arrays.append(array)
            data_fields.append(
                pa.field(self.physical(column), arrays[-1].type, metadata=self._id(column))
            )
        path = self.root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        table = pa.Table.from_arrays(arrays, schema=pa.schema(data_fields))
        pq.write_table(table, path, row_group_size=row_group_size)
        idc = np.asarray(ids, dtype=np.int64)
        stats = {
            "numRecords": len(idc),
            "minValues": {self.physical("id"): int(idc.min())},
            "maxValues": {self.physical("id"): int(idc.max())},
            "nullCount": {self.physical("id"): 0},
        }
        values = {self.physical(c): str(partition) for c in self.partition_by}
        self._live[name] = list(ids)
        return {
            "path": name,
            "partitionValues": values,
            "size": path.stat().st_size,
            "modificationTime": 1_700_000_000_000,
            "dataChange": True,
            "stats": json.dumps(stats),
        }

    def inline_dv(self, add: dict[str, Any], positions: Sequence[int]) -> None:
        """Give ``add`` an inline deletion vector."""
        data = dv_bytes(positions)
        add["deletionVector"] = {
            "storageType": "i",
            "pathOrInlineDv": z85_encode(data),
            "sizeInBytes": len(data),
            "cardinality": len(positions),
        }
        self._drop(add["path"], positions)

    def file_dvs(
        self,
        adds: Mapping[str, dict[str, Any]],
        deletes: Mapping[str, Sequence[int]],
        *,
        prefix: str = "ab",
        absolute: bool = False,
        bad_crc: bool = False,
    ) -> Path:
        """Give each of ``adds`` (by file name) its vector, all in one deletion vector file
        (``"u"``: UUID-named under ``prefix``; ``absolute``: ``"p"``, its full path)."""
        name = uuid.uuid4()
        folder = self.root / prefix if prefix else self.root
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / f"deletion_vector_{name}.bin"
        blob = bytearray([1])
        for file, positions in deletes.items():
            data = dv_bytes(positions)
            offset = len(blob)
            blob += framed(data, bad_crc=bad_crc)
            stored = ("p", path.as_uri()) if absolute else ("u", prefix + z85_encode(name.bytes))
            adds[file]["deletionVector"] = {
                "storageType": stored[0],
                "pathOrInlineDv": stored[1],
                "offset": offset,
                "sizeInBytes": len(data),
                "cardinality": len(positions),
            }
            self._drop(file, positions)
        path.write_bytes(bytes(blob))
        return path

    def _drop(self, name: str, positions: Sequence[int]) -> None:
        gone = set(positions)
        self._live[name] = [i for p, i in enumerate(self._live[name]) if p not in gone]

    def commit(self, adds: Sequence[dict[str, Any]], removes: Sequence[str] = ()) -> int:
        """Commit the next version: the first one's protocol and metadata, then ``adds`` and
        ``removes`` (file names); returns the version."""
        self.version += 1
        actions = self._actions_of_first_commit() if self.version == 0 else []
        actions += [
            {"remove": {"path": r, "deletionTimestamp": 1, "dataChange": True}} for r in removes
        ]
        actions += [{"add": a} for a in adds]
        actions.append({"commitInfo": {"timestamp": 1_700_000_000_000 + self.version}})
        for r in removes:
            self._live.pop(r, None)
        log = self.root / "_delta_log"
        log.mkdir(parents=True, exist_ok=True)
        text = "\n".join(json.dumps(a) for a in actions) + "\n"
        (log / f"{self.version:020d}.json").write_text(text)
        return self.version

    def live(self) -> list[int]:
        """Ids of the live rows of the current version."""
        return sorted(i for ids in self._live.values() for i in ids)


# Files of 7, 2 and 1 row groups; deletes at row-group edges, a whole row group, a whole file.
DV_PARTS = {
    "part-0.parquet": range(0, 300),
    "part-1.parquet": range(300, 380),
    "part-2.parquet": range(380, 400),
    "part-3.parquet": range(400, 460),
}
DV_INLINE = {"part-0.parquet": [0, 39, 40, *range(80, 120), 299]}
DV_FILE = {"part-1.parquet": [0, 79], "part-2.parquet": list(range(20))}


def write_dv_table(
    root: Path, *, mode: str | None = None, absolute: bool = False, nested: bool = False
) -> HandTable:
    """A hand-written table at version 0 (`DV_PARTS`): an inline vector on part-0, on-disk ones
    (one file, ``"p"`` when ``absolute`` else ``"u"``) on part-1 and part-2; part-3 has none."""
    table = HandTable(root, mode=mode, nested=nested)
    adds = {n: table.write_file(n, ids, row_group_size=40) for n, ids in DV_PARTS.items()}
    table.inline_dv(adds["part-0.parquet"], DV_INLINE["part-0.parquet"])
    table.file_dvs(adds, DV_FILE, absolute=absolute)
    table.commit(list(adds.values()))
    return table


def write_partitioned_table(root: Path, *, mode: str | None = None) -> HandTable:
    """A hand-written table partitioned by ``label`` (ids 0..139, a file per label, 2 row
    groups each), a vector deleting the first row of label 3's file."""
    table = HandTable(root, mode=mode, partition_by=("label",))
    adds = {}
    for label in range(7):
        ids = [i for i in range(140) if i % 7 == label]
        name = f"label={label}/part-{label}.parquet"
        adds[name] = table.write_file(name, ids, row_group_size=10, partition=label)
    table.inline_dv(adds["label=3/part-3.parquet"], [0])
    table.commit(list(adds.values()))
    return table


def set_commit_time(root: Path, version: int, seconds: float) -> None:
    """Set a commit file's modification time (deltalake's as_of goes by it)."""
    os.utime(root / "_delta_log" / f"{version:020d}.json", (seconds, seconds))
