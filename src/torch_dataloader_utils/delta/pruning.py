"""Files a row filter cannot match, pruned by their add actions' partition values and min/max
statistics.

Each file's values become a guarantee (``label == 3``, ``id >= 0 & id <= 99``) and pyarrow's
own expression simplification decides whether the filter can hold under it: the file is a
fragment of a dataset whose partition expressions are the guarantees, and
``get_fragments(filter)`` leaves out those where the filter simplifies to false (no file is
opened). Statistics are used where they bound every row: integer and date columns without nulls
(Delta truncates string statistics, and a float's NaN is outside its min and max); a column of
nulls only is guaranteed null.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping, Sequence
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds
import pyarrow.fs as pafs

__all__ = ["kept_files"]


def _bounded(t: pa.DataType) -> bool:
    """Types whose min/max statistics are exact."""
    return bool(pa.types.is_integer(t) or pa.types.is_date(t))


def _guarantee(
    row: Mapping[str, Any],
    schema: pa.Schema,
    partitions: Sequence[str],
    physical: Mapping[str, str],
) -> pc.Expression:
    """What a file's add action says of all its rows."""
    terms: list[pc.Expression] = []
    for column in partitions:
        value = row.get(f"partition.{column}")
        t = schema.field(column).type
        if value is None:
            terms.append(pc.field(column).is_null())
        else:
            # (A value not cast to the column's type: no guarantee.)
            with contextlib.suppress(pa.ArrowInvalid, pa.ArrowNotImplementedError, TypeError):
                terms.append(pc.field(column) == pa.scalar(value).cast(t))
    records = row.get("num_records")
    for field in schema:
        name = physical.get(field.name, field.name)
        if field.name in partitions or not _bounded(field.type):
            continue
        nulls = row.get(f"null_count.{name}")
        low, high = row.get(f"min.{name}"), row.get(f"max.{name}")
        if nulls is not None and records is not None and nulls == records and records > 0:
            terms.append(pc.field(field.name).is_null())
        elif nulls == 0 and low is not None and high is not None:
            try:
                lo, hi = pa.scalar(low).cast(field.type), pa.scalar(high).cast(field.type)
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError, TypeError):
                continue
            terms.append((pc.field(field.name) >= lo) & (pc.field(field.name) <= hi))
    guarantee = pc.scalar(True)
    for term in terms:
        guarantee = guarantee & term
    return guarantee


def kept_files(
    rows: Sequence[Mapping[str, Any]],
    row_filter: pc.Expression | None,
    schema: pa.Schema,
    partitions: Sequence[str],
    physical: Mapping[str, str],
) -> list[bool]:
    """Whether each file (its flattened add action, as deltalake's ``get_add_actions``) may hold
    rows that pass ``row_filter``; ``physical``: logical -> physical column names (the
    statistics' keys)."""
    if row_filter is None or not rows:
        return [True] * len(rows)
    guarantees = [_guarantee(r, schema, partitions, physical) for r in rows]
    names = [f"/{i}" for i in range(len(rows))]
    dataset = ds.FileSystemDataset.from_paths(
        names,
        schema=schema,
        format=ds.ParquetFileFormat(),
        filesystem=pafs.LocalFileSystem(),  # (never opened: only the guarantees are read)
        partitions=guarantees,
    )
    kept = {f.path for f in dataset.get_fragments(filter=row_filter)}
    return [n in kept for n in names]
