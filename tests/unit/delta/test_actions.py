"""Deletion vector descriptors found in the log: the newest add action at or before the version,
in the commits after the newest complete checkpoint, else in it (classic, multi-part, v2 with
sidecars)."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from torch_dataloader_utils.delta.actions import _checkpoint, deletion_vectors, log_path
from torch_dataloader_utils.fs import FileSystemSpec

FS = FileSystemSpec("file")


def _dv(cardinality: int) -> dict[str, object]:
    return {
        "storageType": "i",
        "pathOrInlineDv": "x" * 5,
        "sizeInBytes": 4,
        "cardinality": cardinality,
    }


def test_the_newest_complete_checkpoint_at_or_before_the_version() -> None:
    v = f"{3:020d}"
    w = f"{7:020d}"
    names = [
        f"{v}.checkpoint.parquet",
        f"{w}.checkpoint.0000000001.0000000002.parquet",
        f"{w}.json",
        f"{3:020d}.json",
    ]
    assert _checkpoint(names, 9) == [f"{v}.checkpoint.parquet"]  # 7 lacks a part
    names.append(f"{w}.checkpoint.0000000002.0000000002.parquet")
    assert _checkpoint(names, 9) == [names[1], names[-1]]
    assert _checkpoint(names, 6) == [names[0]]
    assert _checkpoint(names, 2) == []
    v2 = f"{8:020d}.checkpoint.{uuid.uuid4()}.json"
    assert _checkpoint([*names, v2], 8) == [v2]
    assert log_path("p=a%2520b/f.parquet") == "p=a%20b/f.parquet"


def test_descriptors_from_commits_and_a_v2_checkpoint_with_a_sidecar(tmp_path: Path) -> None:
    log = tmp_path / "_delta_log"
    (log / "_sidecars").mkdir(parents=True)
    add = pa.struct(
        [
            ("path", pa.string()),
            (
                "deletionVector",
                pa.struct(
                    [
                        ("storageType", pa.string()),
                        ("pathOrInlineDv", pa.string()),
                        ("offset", pa.int32()),
                        ("sizeInBytes", pa.int32()),
                        ("cardinality", pa.int64()),
                    ]
                ),
            ),
        ]
    )
    sidecar = pa.table(
        {
            "add": pa.array(
                [
                    {"path": "a.parquet", "deletionVector": {**_dv(1), "offset": None}},
                    {"path": "b%20c.parquet", "deletionVector": None},
                ],
                add,
            )
        }
    )
    pq.write_table(sidecar, log / "_sidecars" / "s1.parquet")
    lines = [
        {"checkpointMetadata": {"version": 1}},
        {"sidecar": {"path": "s1.parquet"}},
        {"add": {"path": "d.parquet", "deletionVector": _dv(4)}},
    ]
    name = f"{1:020d}.checkpoint.{uuid.uuid4()}.json"
    (log / name).write_text("\n".join(json.dumps(line) for line in lines))
    # Version 2 gives a.parquet a new vector; version 3 (after the one read) another.
    for version, cardinality in ((2, 2), (3, 3)):
        text = json.dumps({"add": {"path": "a.parquet", "deletionVector": _dv(cardinality)}})
        (log / f"{version:020d}.json").write_text(text + "\n")
    live = ["a.parquet", "b%20c.parquet", "d.parquet"]
    found = deletion_vectors(str(tmp_path), FS, 2, live)
    assert {k: v.cardinality for k, v in found.items()} == {"a.parquet": 2, "d.parquet": 4}
    found = deletion_vectors(str(tmp_path), FS, 1, live)
    assert {k: v.cardinality for k, v in found.items()} == {"a.parquet": 1, "d.parquet": 4}
