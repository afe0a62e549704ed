"""Tables other engines wrote (``tests/delta/data``, see its NOTICE.md) read from S3 (SeaweedFS),
whose data files take the remote decoding path: Databricks' on-disk deletion vector, and Spark's
INT96 timestamps past 2262 in Delta's microseconds. (Uses the remote tier's SeaweedFS fixture.)"""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import pyarrow as pa
import pytest

import torch_dataloader_utils as tdu
from tests.remote.conftest import seaweedfs  # noqa: F401  (the session's server)
from tests.services.seaweedfs import SeaweedFS

pytest.importorskip("deltalake")
pytestmark = [
    pytest.mark.remote,
    pytest.mark.timeout(120),
    pytest.mark.filterwarnings("ignore:This DataLoader will create:UserWarning"),
]
DATA = Path(__file__).parent / "data"
BUCKET = "tdu-delta-interop"


def _read(server: SeaweedFS, name: str, **options: object) -> pa.Table:
    loader = tdu.create_dataloader(
        f"s3://{BUCKET}/{name}",
        format="delta",
        storage_options=server.s3fs_options(),
        output_format="arrow",
        batch_size=3,
        **options,
    )
    return pa.concat_tables(pa.table(b) for b in loader)


def test_databricks_and_spark_tables_on_s3(seaweedfs: SeaweedFS) -> None:  # noqa: F811
    seaweedfs.create_bucket(BUCKET)
    s3 = seaweedfs.filesystem()
    for name in ("table-with-dv-small", "table_with_edge_timestamps"):
        s3.put(str(DATA / name), f"{BUCKET}/{name}", recursive=True)
    for version, values in ((0, range(10)), (1, range(1, 9))):  # version 1 deletes 0 and 9
        got = _read(seaweedfs, "table-with-dv-small", version=version)
        assert sorted(got.column("value").to_pylist()) == list(values)
    workers = {"num_workers": 2, "multiprocessing_context": "fork", "timeout": 60}
    got = _read(seaweedfs, "table_with_edge_timestamps", **workers).sort_by("SOME_VALUE")
    assert got.to_pydict() == {
        "BIG_DATE": [datetime(9999, 12, 31, tzinfo=UTC), datetime(9999, 12, 30, tzinfo=UTC)],
        "NORMAL_DATE": [datetime(2022, 1, 1, tzinfo=UTC), datetime(2022, 2, 1, tzinfo=UTC)],
        "SOME_VALUE": [1, 2],
    }
