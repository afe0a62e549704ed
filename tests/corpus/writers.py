"""Parquet files other writers make: fastparquet, duckdb and polars, each with nested,
dictionary-encoded, nullable, timestamp (several units and time zones), decimal and empty data;
and pyarrow files edited to hold empty structs, which no writer we can install writes.

Written into a temporary folder by `tests/corpus/test_writers.py`, never committed, and read
there by the corpus runner (`tests.corpus.runner`) against pyarrow's ``pq.read_table``, under
the corpus test's rules. ``python -m tests.corpus.writers DIR`` writes them into DIR.

What each writer does that pyarrow does not (docs/adr/0017-files-other-writers-made.md):
fastparquet writes an empty list in the footer as one byte ``0x00`` (element type 0), writes no
nested types (``object_encoding="json"`` gives JSON strings), decimals as doubles and timedeltas
as times; duckdb and polars write a zero-row file with no row groups; none of the three writes
a row group of zero rows.
"""

from __future__ import annotations

import datetime
import decimal
import sys
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from tests.corpus.thrift_edit import drop_leaves

ROWS = 300


@dataclass(frozen=True)
class Written:
    """One file: its name (``<writer>-<what>``, the file is ``<name>.parquet``), how to write
    it, its rows, and the column the library refuses it for at planning (empty: it reads the
    file as pyarrow does)."""

    name: str
    write: Callable[[Path], None]
    rows: int = ROWS
    refused: str = ""


# --- fastparquet ------------------------------------------------------------------------------

# Flattened cloud audit event names (a real user's 74-column file had these).
_AUDIT_NAMES = [
    "eventVersion",
    "userIdentity.type",
    "userIdentity.principalId",
    "userIdentity.arn",
    "userIdentity.accountId",
    "userIdentity.accessKeyId",
    "userIdentity.sessionContext.attributes.creationDate",
    "userIdentity.sessionContext.attributes.mfaAuthenticated",
    "userIdentity.sessionContext.sessionIssuer.type",
    "userIdentity.sessionContext.sessionIssuer.arn",
    "eventTime",
    "eventSource",
    "eventName",
    "awsRegion",
    "sourceIPAddress",
    "userAgent",
    "requestID",
    "eventID",
    "eventType",
    "recipientAccountId",
    "tlsDetails.tlsVersion",
    "tlsDetails.cipherSuite",
]


def _audit_frame(rows: int) -> Any:
    """74 columns: an ``id``, the names above, and ``requestParameters.*`` columns of binary,
    double, string and timestamp values, a fifth of each missing. Strings are object columns:
    fastparquet 2024.5 does not know pandas 3's ``str`` dtype."""
    import pandas as pd

    ids = np.arange(rows, dtype=np.int64)
    columns: dict[str, object] = {"id": ids}
    names = _AUDIT_NAMES + [f"requestParameters.p{k}" for k in range(73 - len(_AUDIT_NAMES))]
    for k, name in enumerate(names):
        kind = k % 4
        missing = (ids + k) % 5 == 0
        if kind == 0:
            values = np.where(missing, np.nan, ids * 0.5 + k)
            columns[name] = values
        elif kind == 1:
            columns[name] = pd.Series(
                [None if m else f"{name}:{i}".encode() for i, m in zip(ids, missing, strict=True)],
                dtype=object,
            )
        elif kind == 2:
            columns[name] = pd.Series(
                [None if m else f"v{(i * 7 + k) % 11}" for i, m in zip(ids, missing, strict=True)],
                dtype=object,
            )
        else:
            stamps = pd.to_datetime(1_700_000_000 + ids * 61 + k, unit="s", utc=k % 8 == 3)
            columns[name] = pd.Series(stamps).where(~missing)
    return pd.DataFrame(columns)


def _fastparquet(rows: int, **options: Any) -> Callable[[Path], None]:
    def write(path: Path) -> None:
        import fastparquet

        with warnings.catch_warnings():  # fastparquet 2024.5's pandas 3 deprecations
            warnings.simplefilter("ignore")
            fastparquet.write(str(path), _audit_frame(rows), **options)

    return write


def _fastparquet_types(path: Path) -> None:
    import fastparquet
    import pandas as pd

    ids = np.arange(ROWS, dtype=np.int64)
    categories = pd.Index(["red", "green", "blue"], dtype=object)
    frame = pd.DataFrame(
        {
            "id": ids,
            # pandas categoricals: dictionary-encoded string columns
            "colour": pd.Categorical.from_codes(np.where(ids % 7 == 0, -1, ids % 3), categories),
            "count": pd.array([None if i % 4 == 0 else int(i) for i in ids], dtype="Int64"),
            "flag": pd.array([None if i % 6 == 0 else bool(i % 2) for i in ids], dtype="boolean"),
            "small": ids.astype(np.uint8),
            "ratio": ids.astype(np.float32) / 3,
            "paris": pd.Series(
                pd.date_range("2024-03-31", periods=ROWS, freq="7min", tz="Europe/Paris")
            ),
            "utc": pd.Series(pd.date_range("2024-01-01", periods=ROWS, freq="s", tz="UTC")),
            "naive_ns": pd.Series(
                pd.date_range("1999-12-31 23:00", periods=ROWS, freq="1ms")
            ).astype("datetime64[ns]"),
            "elapsed": pd.Series(pd.to_timedelta(ids % 86_400, unit="s")),
            "price": pd.Series([decimal.Decimal(int(i)) / 4 for i in ids], dtype=object),
            "doc": pd.Series(
                [None if i % 5 == 0 else {"id": int(i), "tags": ["a", "b"][: i % 3]} for i in ids],
                dtype=object,
            ),
        }
    )
    with warnings.catch_warnings():  # fastparquet 2024.5's pandas 3 deprecations
        warnings.simplefilter("ignore")
        fastparquet.write(
            str(path),
            frame,
            row_group_offsets=[0, 100, 250],
            object_encoding={"colour": "utf8", "price": "decimal", "doc": "json"},
            compression="SNAPPY",
        )


# --- duckdb -----------------------------------------------------------------------------------

# Rows and row groups: duckdb's row groups are whole vectors of 2,048 rows.
_DUCK_ROWS = 5000
_DUCK_NESTED = """
SELECT i::BIGINT AS id,
  CASE WHEN i % 5 = 0 THEN NULL ELSE [i, i + 1, NULL] END AS list,
  CASE WHEN i % 7 = 0 THEN NULL
       ELSE {'a': i, 'b': 'v' || (i % 3)::VARCHAR, 'c': [{'x': i::DOUBLE}, NULL]} END AS struct,
  CASE WHEN i % 4 = 0 THEN NULL ELSE MAP {'k' || (i % 3)::VARCHAR: i, 'z': NULL} END AS map,
  [[i], [], NULL] AS lists,
  CASE WHEN i % 9 = 0 THEN [] ELSE [{'k': i::VARCHAR, 'v': [i::DOUBLE]}] END AS structs
FROM range({rows}) t(i)
"""
_DUCK_TYPES = """
SELECT i::BIGINT AS id,
  'c' || (i % 3)::VARCHAR AS low_cardinality,
  (['red', 'green', 'blue'])[1 + i % 3]::ENUM('red', 'green', 'blue') AS colour,
  CASE WHEN i % 3 = 0 THEN NULL ELSE i::DOUBLE END AS maybe,
  TIMESTAMP '2024-03-10 01:00:00' + INTERVAL (i) MINUTE AS ts,
  TIMESTAMPTZ '2024-03-10 01:00:00+00' + INTERVAL (i) MINUTE AS ts_tz,
  (TIMESTAMP '2024-01-01' + INTERVAL (i) SECOND)::TIMESTAMP_MS AS ts_ms,
  (TIMESTAMP '2024-01-01' + INTERVAL (i) SECOND)::TIMESTAMP_S AS ts_s,
  (TIMESTAMP '2024-01-01' + INTERVAL (i) SECOND)::TIMESTAMP_NS AS ts_ns,
  (i / 8)::DECIMAL(4, 1) AS d4,
  (i * 1.125)::DECIMAL(18, 3) AS d18,
  CASE WHEN i % 11 = 0 THEN NULL ELSE (i * 1000000000.5)::DECIMAL(38, 10) END AS d38,
  DATE '2024-01-01' + i::INTEGER AS day,
  TIME '01:02:03' + INTERVAL (i) SECOND AS clock,
  i::HUGEINT AS huge,
  (i % 256)::UTINYINT AS small,
  md5(i::VARCHAR)::UUID AS uuid,
  ('x' || i::VARCHAR)::BLOB AS blob
FROM range({rows}) t(i)
"""


def _duckdb(query: str, rows: int, options: str = "") -> Callable[[Path], None]:
    def write(path: Path) -> None:
        import duckdb

        with duckdb.connect() as con:
            sql = query.replace("{rows}", str(rows))
            con.sql(f"COPY ({sql}) TO '{path}' (FORMAT parquet, ROW_GROUP_SIZE 2048{options})")

    return write


# --- polars -----------------------------------------------------------------------------------


def _polars_frame(rows: int) -> Any:
    import polars as pl

    ids = list(range(rows))
    start = datetime.datetime(2024, 3, 31, 0, 30)
    stamps = [start + datetime.timedelta(minutes=7 * i) for i in ids]
    return pl.DataFrame(
        {
            "id": pl.Series(ids, dtype=pl.Int64),
            "list": [None if i % 5 == 0 else [i, None, i + 2][: i % 4] for i in ids],
            "struct": [None if i % 7 == 0 else {"a": i, "b": f"v{i % 3}"} for i in ids],
            "structs": [[{"k": str(i), "v": [float(i)]}] if i % 9 else [] for i in ids],
            "array": pl.Series(
                [None if i % 6 == 0 else [i, -i] for i in ids], dtype=pl.Array(pl.Int32, 2)
            ),
            "category": pl.Series(
                [None if i % 8 == 0 else f"c{i % 4}" for i in ids], dtype=pl.Categorical
            ),
            "colour": pl.Series(
                [("red", "green", "blue")[i % 3] for i in ids],
                dtype=pl.Enum(["red", "green", "blue"]),
            ),
            "ts_ms": pl.Series(stamps, dtype=pl.Datetime("ms")),
            "ts_us_paris": pl.Series(stamps, dtype=pl.Datetime("us", "Europe/Paris")),
            "ts_ns_utc": pl.Series(stamps, dtype=pl.Datetime("ns", "UTC")),
            "price": pl.Series(
                [None if i % 10 == 0 else decimal.Decimal(i) / 100 for i in ids],
                dtype=pl.Decimal(12, 2),
            ),
            "elapsed": pl.Series([datetime.timedelta(milliseconds=i) for i in ids]),
            "day": pl.Series([datetime.date(2024, 1, 1) + datetime.timedelta(i) for i in ids]),
            "clock": pl.Series([datetime.time(i % 24, i % 60) for i in ids]),
            "blob": [None if i % 3 == 0 else bytes([i % 256]) * (i % 4) for i in ids],
            "maybe": [None if i % 2 else i / 2 for i in ids],
        }
    )


def _polars(rows: int, **options: Any) -> Callable[[Path], None]:
    def write(path: Path) -> None:
        _polars_frame(rows).write_parquet(path, **options)

    return write


# --- empty structs: pyarrow files whose footers lost a struct's only leaves -------------------


def _empty_structs(columns: dict[str, pa.Array]) -> Callable[[Path], None]:
    """``columns`` with each ``struct<>`` written as ``struct<dummy: int8>``, whose ``dummy``
    leaves are then dropped from the footer (`thrift_edit.drop_leaves`)."""

    def write(path: Path) -> None:
        source = path.with_name(path.stem + "-source.parquet")
        pq.write_table(pa.table(columns), source, row_group_size=120)
        drop_leaves(source, path, {b"dummy"})
        source.unlink()

    return write


def _nulls_at(n: int, every: int) -> list[bool]:
    return [i % every == 0 for i in range(n)]


def _struct_column(*, also: bool) -> pa.Array:
    """``struct<inner: struct<dummy: int8>>`` (with an int64 ``x`` beside ``inner`` when
    ``also``), every fourth row null."""
    dummy = pa.struct([("dummy", pa.int8())])
    fields = [pa.field("inner", dummy)] + ([pa.field("x", pa.int64())] if also else [])
    children = [pa.array([{"dummy": 1}] * ROWS, dummy)]
    if also:
        children.append(pa.array(range(ROWS), pa.int64()))
    return pa.StructArray.from_arrays(children, fields=fields, mask=pa.array(_nulls_at(ROWS, 4)))


def _empty_struct_files() -> list[Written]:
    dummy = pa.struct([("dummy", pa.int8())])
    ids = pa.array(range(ROWS), pa.int64())
    top = pa.StructArray.from_arrays(
        [pa.array([1] * ROWS, pa.int8())],
        fields=[pa.field("dummy", pa.int8())],
        mask=pa.array(_nulls_at(ROWS, 3)),
    )
    lists = pa.array(
        [None if i % 5 == 0 else [{"dummy": 1}] * (i % 3) for i in range(ROWS)], pa.list_(dummy)
    )
    leafless = {
        "id": ids,
        "empty": top,  # struct<>
        "nested_empty": _struct_column(also=False),  # struct<inner: struct<>>
        "list_of_empty": lists,  # list<struct<>>
        "value": pa.array([i / 2 for i in range(ROWS)]),
    }
    beside = {"id": ids, "partly_empty": _struct_column(also=True)}
    return [
        Written("pyarrow-empty-structs", _empty_structs(leafless)),
        Written(
            "pyarrow-empty-struct-beside-leaves", _empty_structs(beside), refused="partly_empty"
        ),
    ]


def files() -> list[Written]:
    """Every file, in a stable order."""
    fastparquet = [
        # Defaults (statistics "auto"): the footers that a real user's file was refused for.
        Written("fastparquet-audit", _fastparquet(ROWS, row_group_offsets=100)),
        Written(
            "fastparquet-audit-int96-gzip-stats",
            _fastparquet(
                ROWS, row_group_offsets=[0, 7, 150], times="int96", stats=True, compression="GZIP"
            ),
        ),
        Written(
            "fastparquet-audit-no-stats-utf8",
            _fastparquet(ROWS, stats=False, object_encoding="infer", compression="SNAPPY"),
        ),
        Written("fastparquet-types", _fastparquet_types),
        Written("fastparquet-empty", _fastparquet(0), rows=0),
    ]
    duckdb = [
        Written("duckdb-nested", _duckdb(_DUCK_NESTED, _DUCK_ROWS), rows=_DUCK_ROWS),
        Written("duckdb-types", _duckdb(_DUCK_TYPES, _DUCK_ROWS), rows=_DUCK_ROWS),
        Written(
            "duckdb-types-v2-zstd",
            _duckdb(_DUCK_TYPES, _DUCK_ROWS, ", PARQUET_VERSION V2, COMPRESSION zstd"),
            rows=_DUCK_ROWS,
        ),
        Written("duckdb-empty", _duckdb(_DUCK_NESTED, 0), rows=0),
    ]
    polars = [
        Written("polars-all", _polars(ROWS, row_group_size=64)),
        Written("polars-all-lz4-no-stats", _polars(ROWS, compression="lz4", statistics=False)),
        Written("polars-empty", _polars(0), rows=0),
    ]
    return fastparquet + duckdb + polars + _empty_struct_files()


def write_all(root: Path) -> dict[str, Path]:
    """Every file written under ``root``, by name."""
    root.mkdir(parents=True, exist_ok=True)
    found = {}
    for written in files():
        path = root / f"{written.name}.parquet"
        written.write(path)
        found[written.name] = path
    return found


if __name__ == "__main__":
    for name, path in write_all(Path(sys.argv[1])).items():
        print(f"{name}: {path}")
