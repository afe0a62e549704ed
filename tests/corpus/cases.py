"""The real-world corpus: which files, read as which format, and the reference reader of each.

The corpus lives beside the project (``../shared/realworld-data``, CI has it there too) and is
never copied into the repository. A file's format follows from its path (``SOURCES.md`` there);
the reference is pyarrow's own reader of that format (webdataset's tar grouping for shards), run
on the whole file at once.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa

ROOT = Path(__file__).resolve().parents[2].parent / "shared" / "realworld-data"

# Files that are not data files of any format.
_NOT_DATA = {"SOURCES.md", "README.md"}


@dataclass(frozen=True)
class Case:
    """One corpus file: its path relative to `ROOT`, the library's format and options."""

    relpath: str
    format: str
    options: dict[str, Any] = field(default_factory=dict)
    ipc_kind: str = ""  # "file" or "stream" for IPC

    @property
    def path(self) -> str:
        return str(ROOT / self.relpath)


def _case(relpath: str) -> Case | None:
    name = relpath.rsplit("/", 1)[-1]
    if name in _NOT_DATA:
        return None
    if "/parquet/fuzzing/" in relpath or name.endswith((".parquet", ".parquet.encrypted")):
        return Case(relpath, "parquet")
    if name.endswith(".orc"):
        return Case(relpath, "orc")
    if name.endswith(".arrow_file") or "/arrow-ipc-file/" in relpath or name.endswith(".arrow"):
        return Case(relpath, "ipc", ipc_kind="file")
    if name.endswith(".stream") or "/arrow-ipc-stream/" in relpath:
        return Case(relpath, "ipc", ipc_kind="stream")
    if name.endswith(".tsv"):
        return Case(relpath, "csv", {"delimiter": "\t"})
    if name.endswith((".csv", ".csv.gz")) or "/csv/fuzzing/" in relpath:
        return Case(relpath, "csv")
    if name.endswith((".json", ".ndjson", ".jsonl", ".geojsonl")):
        return Case(relpath, "json")
    if name.endswith((".tar", ".tgz")):
        return Case(relpath, "webdataset", {"missing_component": "empty", "decode": False})
    raise AssertionError(f"corpus file {relpath} has no known format: extend tests/corpus/cases.py")


def all_cases() -> list[Case]:
    """Every data file of the corpus, sorted by path."""
    if not ROOT.is_dir():
        return []
    found = []
    for dirpath, _, files in os.walk(ROOT):
        for name in files:
            rel = os.path.relpath(os.path.join(dirpath, name), ROOT)
            case = _case(rel.replace(os.sep, "/"))
            if case is not None:
                found.append(case)
    return sorted(found, key=lambda c: c.relpath)


# --- reference readers ------------------------------------------------------------------------


def _tar_reference(path: str) -> pa.Table:
    """Samples as webdataset groups them (``tar_file_expander`` + ``group_by_keys``), each
    component's raw bytes; a component a sample lacks is ``b""`` (``missing_component="empty"``)."""
    import webdataset as wds
    from webdataset.tariterators import group_by_keys, tar_file_expander

    with open(path, "rb") as stream:
        samples = list(
            group_by_keys(
                tar_file_expander([{"stream": stream, "url": path}], handler=wds.reraise_exception)
            )
        )
    columns: list[str] = ["__key__", "__url__"]
    for sample in samples:
        for key in sample:
            if key not in columns and not key.startswith("__"):
                columns.append(key)
    data: dict[str, list[Any]] = {c: [] for c in columns}
    for sample in samples:
        for c in columns:
            data[c].append(sample.get(c, b""))
    return pa.table({c: pa.array(v) for c, v in data.items()})


def _whole_file(path: str) -> int:
    """A parse block holding the whole file: the reference reads any record, however long."""
    return max(1 << 20, os.path.getsize(path) + 1)


def reference(case: Case) -> pa.Table:
    """The whole file read by the reference reader; raises what that reader raises."""
    path = case.path
    if case.format == "parquet":
        import pyarrow.parquet as pq

        return pq.read_table(path, page_checksum_verification=True)
    if case.format == "orc":
        from pyarrow import orc

        return orc.ORCFile(path).read()
    if case.format == "ipc":
        from pyarrow import ipc

        if case.ipc_kind == "file":
            return ipc.open_file(path).read_all()
        return ipc.open_stream(path).read_all()
    if case.format == "csv":
        from pyarrow import csv

        delimiter = case.options.get("delimiter", ",")
        return csv.read_csv(
            path,
            read_options=csv.ReadOptions(
                encoding=case.options.get("encoding", "utf8"), block_size=_whole_file(path)
            ),
            parse_options=csv.ParseOptions(delimiter=delimiter, newlines_in_values=True),
        )
    if case.format == "json":
        from pyarrow import json

        return json.read_json(path, read_options=json.ReadOptions(block_size=_whole_file(path)))
    if case.format == "webdataset":
        return _tar_reference(path)
    raise AssertionError(case.format)
