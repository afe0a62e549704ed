"""Delta tables on S3 (SeaweedFS, signature-checked): the log read by deltalake under our fsspec
storage options translated to delta-rs's, data files and on-disk deletion vectors read through
our storage, with real DataLoader workers; time travel by version. (Uses the remote tier's
SeaweedFS fixture: it fails under ``CI=true`` when the server cannot start.)"""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

import torch_dataloader_utils as tdu
from tests.delta.tables import make_rows, write_dv_table
from tests.remote.conftest import seaweedfs  # noqa: F401  (the session's server)
from tests.services.seaweedfs import SeaweedFS

pytest.importorskip("deltalake")
pytestmark = [
    pytest.mark.remote,
    pytest.mark.timeout(240),
    pytest.mark.filterwarnings("ignore:This DataLoader will create:UserWarning"),
]
BUCKET = "tdu-delta"


def _delta_rs(server: SeaweedFS) -> dict[str, str]:
    """delta-rs's options for writing the test tables (reads translate ours)."""
    return {
        "AWS_ACCESS_KEY_ID": server.access_key,
        "AWS_SECRET_ACCESS_KEY": server.secret_key,
        "AWS_ENDPOINT_URL": server.endpoint_url,
        "AWS_REGION": server.region,
        "AWS_ALLOW_HTTP": "true",
        "AWS_S3_ALLOW_UNSAFE_RENAME": "true",
    }


def _ids(loader: Any) -> Counter[int]:
    return Counter(int(i) for batch in loader for i in batch["id"])


def test_a_delta_table_on_s3_with_deletion_vectors(
    seaweedfs: SeaweedFS,  # noqa: F811
    tmp_path: Path,
) -> None:
    seaweedfs.create_bucket(BUCKET)
    local = tmp_path / "dv"
    table = write_dv_table(local, mode="name")  # on-disk vectors are "u": under the table
    s3 = seaweedfs.filesystem()
    s3.put(str(local), f"{BUCKET}/dv", recursive=True)
    loader = tdu.create_dataloader(
        f"s3://{BUCKET}/dv",
        format="delta",
        storage_options=seaweedfs.s3fs_options(),
        batch_size=32,
        shuffle=True,
        num_workers=2,
        multiprocessing_context="fork",
        timeout=60,
    )
    assert _ids(loader) == Counter(table.live())


def test_time_travel_on_s3(seaweedfs: SeaweedFS) -> None:  # noqa: F811
    from deltalake import write_deltalake

    seaweedfs.create_bucket(BUCKET)
    uri = f"s3://{BUCKET}/travel"
    options = _delta_rs(seaweedfs)
    write_deltalake(uri, pa.table(make_rows(range(50))), storage_options=options)
    write_deltalake(uri, pa.table(make_rows(range(50, 80))), mode="append", storage_options=options)
    for version, ids in ((0, range(50)), (1, range(80)), (None, range(80))):
        loader = tdu.create_dataloader(
            uri,
            format="delta",
            version=version,
            storage_options=seaweedfs.s3fs_options(),
            batch_size=16,
        )
        assert _ids(loader) == Counter(ids)
    with pytest.raises(tdu.StorageNotFoundError, match="nothing"):
        tdu.create_dataloader(
            f"s3://{BUCKET}/nothing", format="delta", storage_options=seaweedfs.s3fs_options()
        )
