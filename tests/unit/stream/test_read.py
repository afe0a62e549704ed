"""`stream.read.Reader`: batches of files that differ only as planning lets them (a column's
nullability, a fixed-size list child's) come out in the plan's schema, so they concatenate."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import torch_dataloader_utils as tdu


def _write(root: Path, ids: range, *, required: bool) -> None:
    item = pa.field("element", pa.float32(), nullable=not required)
    schema = pa.schema(
        [
            pa.field("id", pa.int64(), nullable=not required),
            pa.field("e", pa.list_(item, 2), nullable=not required),
        ]
    )
    table = pa.table({"id": list(ids), "e": [[float(i), 1.0] for i in ids]}, schema=schema)
    pq.write_table(table, root / f"part-{ids.start}.parquet", row_group_size=10)


@pytest.mark.parametrize("output_format", ["torch", "arrow"])
def test_files_that_differ_in_nullability_share_a_block(tmp_path: Path, output_format: str) -> None:
    _write(tmp_path, range(0, 50), required=True)
    _write(tmp_path, range(50, 100), required=False)
    loader = tdu.create_dataloader(
        str(tmp_path), batch_size=16, shuffle=True, output_format=output_format
    )
    seen: Counter[int] = Counter()
    for batch in loader:
        ids = batch["id"].tolist() if output_format == "torch" else batch["id"].to_pylist()
        seen.update(ids)
        if output_format == "arrow":
            assert batch.schema.equals(loader.dataset.plan.schema)
            assert [v[0] for v in batch["e"].to_pylist()] == [float(i) for i in ids]
        else:
            assert batch["e"][:, 0].tolist() == [float(i) for i in ids]
    assert seen == Counter(range(100))
