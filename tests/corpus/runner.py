"""Reads corpus files through the library and the reference reader, in a child process.

Run as ``python -m tests.corpus.runner``: it reads one JSON request per line on stdin (a corpus
file and a loader configuration) and writes one JSON verdict per line on stdout. The test process
(`tests/corpus/test_corpus.py`) keeps one such child, kills it when a request runs past its
timeout and starts another after a crash, so an abort or a hang fails one case, not the suite.

A verdict is one of:

- ``match``: the library delivered exactly the reference's rows and values (as multisets);
- ``refused``: the library raised one of its own errors naming the file (``stage`` says
  whether at planning, i.e. in ``create_dataloader``, or while reading);
- ``mismatch``: both read, other rows or values (``detail`` shows the first differences);
- ``raw``: the library raised something that is not a library error, or one not naming the file.

plus what the reference did (``reference``: ``ok`` or its error).
"""

from __future__ import annotations

import datetime
import decimal
import json
import math
import os
import shutil
import sys
import traceback
from collections import Counter
from typing import Any

import pyarrow as pa
import torch

import torch_dataloader_utils as tdu
from tests.corpus.cases import Case, reference
from torch_dataloader_utils.formats.names import unique_names

# Keys the library adds beside a column in torch output.
_LENGTHS, _VALID, _VALUES_VALID = "_lengths", "_valid", "_values_valid"


# --- canonical values: hashable, NaN equal to NaN ---------------------------------------------


def _canon(value: Any) -> Any:
    if isinstance(value, float):
        return "NaN" if math.isnan(value) else value
    if isinstance(value, str):
        return ("s", value)
    if isinstance(value, bytes | bytearray | memoryview):
        return ("b", bytes(value))
    if isinstance(value, dict):
        return ("d", tuple((k, _canon(v)) for k, v in value.items()))
    if isinstance(value, list | tuple):
        return ("l", tuple(_canon(v) for v in value))
    if isinstance(value, decimal.Decimal):
        return ("dec", str(value))
    if isinstance(value, datetime.datetime | datetime.date | datetime.time | datetime.timedelta):
        return ("t", repr(value))
    return value


def _storage(array: pa.Array | pa.ChunkedArray, as_bytes: bool = False) -> Any:
    """An array's values with what cannot become Python objects turned into what can: extension
    values as their storage, temporal values (at any depth) as their stored integers, and with
    ``as_bytes`` strings as bytes (they may not be UTF-8)."""
    if isinstance(array, pa.ChunkedArray):
        chunks = [_storage(c, as_bytes) for c in array.chunks]
        return pa.chunked_array(chunks, _storage_type(array.type, as_bytes))
    if isinstance(array.type, pa.ExtensionType):
        return _storage(array.storage, as_bytes)
    target = _storage_type(array.type, as_bytes)
    if target == array.type:
        return array
    try:
        return array.view(target)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, TypeError):
        return array.cast(target)


def _storage_type(t: pa.DataType, as_bytes: bool = False) -> pa.DataType:
    if isinstance(t, pa.ExtensionType):
        return _storage_type(t.storage_type, as_bytes)
    if as_bytes and (pa.types.is_string(t) or pa.types.is_large_string(t)):
        return pa.large_binary()  # compared as bytes: they may not be UTF-8
    if pa.types.is_date32(t) or pa.types.is_time32(t):
        return pa.int32()
    if (
        pa.types.is_timestamp(t)
        or pa.types.is_date64(t)
        or pa.types.is_time64(t)
        or pa.types.is_duration(t)
    ):
        return pa.int64()
    if pa.types.is_struct(t):
        return pa.struct([f.with_type(_storage_type(f.type, as_bytes)) for f in t])
    if pa.types.is_map(t):
        return pa.map_(
            t.key_field.with_type(_storage_type(t.key_type, as_bytes)),
            t.item_field.with_type(_storage_type(t.item_type, as_bytes)),
        )
    if pa.types.is_list(t):
        return pa.list_(t.value_field.with_type(_storage_type(t.value_type, as_bytes)))
    if pa.types.is_large_list(t):
        return pa.large_list(t.value_field.with_type(_storage_type(t.value_type, as_bytes)))
    if pa.types.is_fixed_size_list(t):
        return pa.list_(t.value_field.with_type(_storage_type(t.value_type, as_bytes)), t.list_size)
    return t


def _column_values(array: pa.ChunkedArray | pa.Array) -> list[Any]:
    try:
        return array.to_pylist()
    except (ValueError, OverflowError, pa.ArrowException):  # dates out of Python's range, ...
        return _storage(array, as_bytes=True).to_pylist()


def table_rows(table: pa.Table) -> Counter[tuple[Any, ...]]:
    """The multiset of a table's rows, by column position."""
    columns = [_column_values(c) for c in table.columns]
    return Counter(tuple(_canon(c[i]) for c in columns) for i in range(table.num_rows))


def torch_reference_rows(table: pa.Table) -> Counter[tuple[Any, ...]]:
    """The multiset of rows the documented torch mapping gives: temporal values as their stored
    integers (docs/reference/types.md), everything else as its Python value."""
    columns = [
        _intervals(c.to_pylist()) if pa.types.is_interval(c.type) else _storage(c).to_pylist()
        for c in table.columns
    ]
    return Counter(tuple(_canon(c[i]) for c in columns) for i in range(table.num_rows))


def _intervals(values: list[Any]) -> list[Any]:
    """month_day_nano intervals as the documented dicts."""
    return [
        None if v is None else {"months": v.months, "days": v.days, "nanoseconds": v.nanoseconds}
        for v in values
    ]


def _tensor_rows(batch: dict[str, Any], name: str) -> list[Any]:
    value = batch[name]
    if isinstance(value, torch.Tensor):
        if value.is_nested:
            rows = [t.tolist() for t in value.unbind()]
        elif value.dim() == 2 and name + _LENGTHS in batch:
            lengths = batch[name + _LENGTHS].tolist()
            rows = [row[:n] for row, n in zip(value.tolist(), lengths, strict=True)]
        else:
            rows = value.tolist()
    else:
        rows = list(value)
    if name + _VALUES_VALID in batch:  # a list column's values: None where masked
        masks = _tensor_rows({"m": batch[name + _VALUES_VALID], **_lengths(batch, name)}, "m")
        rows = [
            [v if ok else None for v, ok in zip(row, mask, strict=True)]
            for row, mask in zip(rows, masks, strict=True)
        ]
    if name + _VALID in batch:
        valid = batch[name + _VALID].tolist()
        rows = [r if ok else None for r, ok in zip(rows, valid, strict=True)]
    return rows


def _lengths(batch: dict[str, Any], name: str) -> dict[str, Any]:
    return {"m" + _LENGTHS: batch[name + _LENGTHS]} if name + _LENGTHS in batch else {}


def torch_rows(batches: list[dict[str, Any]], names: list[str]) -> Counter[tuple[Any, ...]]:
    """The multiset of rows in torch-output batches, columns in ``names`` order."""
    found: Counter[tuple[Any, ...]] = Counter()
    for batch in batches:
        columns = [_tensor_rows(batch, n) for n in names]
        for row in zip(*columns, strict=True):
            found[tuple(_canon(v) for v in row)] += 1
    return found


def _difference(got: Counter[Any], want: Counter[Any]) -> str:
    extra, missing = got - want, want - got
    return (
        f"{sum(got.values())} rows delivered, {sum(want.values())} expected; "
        f"{sum(missing.values())} missing (first: {list(missing)[:2]!r:.400}), "
        f"{sum(extra.values())} extra (first: {list(extra)[:2]!r:.400})"
    )


# --- one request ------------------------------------------------------------------------------


def _error(exc: BaseException) -> dict[str, Any]:
    return {"type": type(exc).__name__, "message": str(exc)[-8000:]}


def _names_file(case: Case, exc: BaseException) -> bool:
    return case.relpath.rsplit("/", 1)[-1] in str(exc)


def _after_planning(case: Case, change: dict[str, Any] | None) -> None:
    """Change the file between planning and reading, as another job writing it would."""
    if not change:
        return
    path = case.path
    action = change["action"]
    if action == "delete":
        os.remove(path)
    elif action == "replace":  # another file moved over it (a rewrite of the same name)
        shutil.copyfile(change["source"], path + ".new")
        os.replace(path + ".new", path)
    elif action == "append":
        with open(path, "ab") as f, open(change["source"], "rb") as extra:
            f.write(extra.read())
    elif action == "truncate":
        os.truncate(path, int(change["size"]))
    else:
        raise AssertionError(f"unknown change {action!r}")


def _reference(case: Case) -> pa.Table:
    """The reference's read of ``case``, Parquet files whose names repeat read whole by
    ``ParquetFile``: ``pq.read_table`` (the dataset API) cannot bind a repeated name."""
    try:
        return reference(case)
    except pa.ArrowInvalid as exc:
        if case.format != "parquet" or "Multiple matches for FieldRef" not in str(exc):
            raise
    import pyarrow.parquet as pq

    return pq.ParquetFile(case.path, page_checksum_verification=True).read()


def run(request: dict[str, Any]) -> dict[str, Any]:
    case = Case(**request["case"])
    config = request["config"]
    verdict: dict[str, Any] = {"config": config}
    try:
        expected = _reference(case)
        # Repeated or empty names (and names a Python user cannot have: a failure): the
        # library reads them under the documented new names.
        expected = expected.rename_columns(list(unique_names(expected.schema.names)))
        verdict["reference"] = "ok"
    except Exception as exc:  # the reference refuses the file
        expected = None
        verdict["reference"] = _error(exc)
    output = config["output"]
    stage = "planning"
    try:
        loader = tdu.create_dataloader(
            case.path,
            format=case.format,
            format_options=case.options or None,
            batch_size=config["batch_size"],
            shuffle=config["shuffle"],
            shuffle_seed=config.get("seed", 7),
            num_workers=config["workers"],
            multiprocessing_context="fork" if config["workers"] else None,
            output_format=output,
            null_policy="mask",
            timeout=120,
        )
        stage = "reading"
        _after_planning(case, config.get("after_planning"))
        batches = list(loader)
    except tdu.TorchDataloaderUtilsError as exc:
        named = _names_file(case, exc)
        verdict.update(
            verdict="refused" if named else "raw",
            stage=stage,
            error=_error(exc),
            detail="" if named else "the error does not name the file",
        )
        return verdict
    except Exception as exc:
        verdict.update(
            verdict="raw", stage=stage, error=_error(exc), detail=traceback.format_exc()[-3000:]
        )
        return verdict
    if expected is None:
        rows = sum(b.num_rows if output == "arrow" else _batch_len(b) for b in batches)
        verdict.update(verdict="read", detail=f"{rows} rows where the reference failed")
        return verdict
    if output == "arrow":
        got_table = pa.Table.from_batches(batches) if batches else expected.schema.empty_table()
        got, want = table_rows(got_table), table_rows(expected)
        verdict["types"] = [str(t) for t in got_table.schema.types]
        verdict["reference_types"] = [str(t) for t in expected.schema.types]
    else:
        got = torch_rows(batches, expected.schema.names)
        want = torch_reference_rows(expected)
    if got == want:
        verdict.update(verdict="match", rows=sum(want.values()))
    else:
        verdict.update(verdict="mismatch", detail=_difference(got, want))
    return verdict


def _batch_len(batch: dict[str, Any]) -> int:
    for value in batch.values():
        return len(value)
    return 0


def main() -> None:
    for line in sys.stdin:
        if not line.strip():
            continue
        try:
            verdict = run(json.loads(line))
        except Exception as exc:  # a bug in this runner: reported, never a hang
            verdict = {
                "verdict": "runner-error",
                "error": _error(exc),
                "detail": traceback.format_exc()[-3000:],
            }
        sys.stdout.write(json.dumps(verdict, default=str) + "\n")
        sys.stdout.flush()


if __name__ == "__main__":
    main()
