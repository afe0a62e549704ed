"""Our fsspec storage options as delta-rs takes them."""

from __future__ import annotations

from pathlib import Path

from torch_dataloader_utils.delta.storage import delta_storage_options, table_uri
from torch_dataloader_utils.fs import FileSystemSpec


def test_s3_options_translate_to_delta_rs() -> None:
    fs = FileSystemSpec(
        "s3",
        {
            "key": "k",
            "secret": "s",
            "token": "t",
            "endpoint_url": "http://localhost:8333",
            "client_kwargs": {"region_name": "eu-west-1"},
            "AWS_S3_LOCKING_PROVIDER": "none",
        },
    )
    assert delta_storage_options(fs) == {
        "AWS_ACCESS_KEY_ID": "k",
        "AWS_SECRET_ACCESS_KEY": "s",
        "AWS_SESSION_TOKEN": "t",
        "AWS_ENDPOINT_URL": "http://localhost:8333",
        "AWS_ALLOW_HTTP": "true",
        "AWS_REGION": "eu-west-1",
        "AWS_S3_LOCKING_PROVIDER": "none",
    }
    assert delta_storage_options(FileSystemSpec("s3", {"anon": True})) == {
        "AWS_SKIP_SIGNATURE": "true"
    }
    assert table_uri("s3://bucket/lake/events/", fs) == "s3://bucket/lake/events"


def test_local_tables_need_no_options(tmp_path: Path) -> None:
    fs = FileSystemSpec("file")
    assert delta_storage_options(fs) == {}
    assert table_uri(f"file://{tmp_path}/t/", fs) == f"{tmp_path}/t"
