"""A file rewritten on the store after planning is refused, naming it, on every store: the plan
pins each object's size and version (ETag on S3 and Azure, generation on GCS) as listed. Read
by workers or in the process that planned (whose listing's answers must not stand in for the
store's: each pass asks the store), through either client."""

from __future__ import annotations

import uuid
from collections import Counter

import pyarrow.parquet as pq
import pytest

import torch_dataloader_utils as tdu
from tests.remote.conftest import BUCKET, RemoteData, dataset_table

pytestmark = [
    pytest.mark.remote,
    pytest.mark.timeout(120),
    pytest.mark.filterwarnings("ignore:This DataLoader will create:UserWarning"),
]


@pytest.mark.parametrize("store", ["s3", "gcs", "azure"])
@pytest.mark.parametrize("change", ["same size", "rows appended"])
@pytest.mark.parametrize(("backend", "workers"), [("auto", 2), ("auto", 0), ("fsspec", 0)])
def test_an_object_rewritten_after_planning_is_refused(
    request: pytest.FixtureRequest, tmp_path, store: str, change: str, backend: str, workers: int
) -> None:
    data: RemoteData = request.getfixturevalue(f"{store}_data")
    protocol = data.url.split("://", 1)[0]
    prefix = f"{BUCKET}/identity-{uuid.uuid4().hex[:8]}"
    local = tmp_path / "a.parquet"
    pq.write_table(dataset_table(range(100)), local, row_group_size=50)
    data.fs.put_file(str(local), f"{prefix}/a.parquet")
    data.fs.invalidate_cache()
    url = f"{protocol}://{prefix}"
    loader = tdu.create_dataloader(
        url,
        format="parquet",
        batch_size=10,
        storage_options=data.storage_options,
        storage_backend=backend,
        num_workers=workers,
    )
    assert Counter(i for b in loader for i in b["id"].tolist()) == Counter(range(100))

    if change == "same size":  # another writer's bytes, the same length
        raw = bytearray(local.read_bytes())
        raw[len(raw) // 2] ^= 0x10
        local.write_bytes(bytes(raw))
    else:
        pq.write_table(dataset_table(range(150)), local, row_group_size=50)
    data.fs.put_file(str(local), f"{prefix}/a.parquet")
    with pytest.raises(tdu.FileChangedError, match=f"{url}/a.parquet: changed after planning"):
        list(loader)
