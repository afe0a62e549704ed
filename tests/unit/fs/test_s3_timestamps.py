"""S3 responses' timestamps parsed by the standard library: the instants botocore gives, for
every form a store sends, and the session s3fs would make, given before its first request."""

from __future__ import annotations

import asyncio
import datetime
from typing import Any

import botocore.session
import pytest
import s3fs
from botocore.utils import parse_timestamp

from torch_dataloader_utils.fs.s3_timestamps import quick_timestamp, quick_timestamps


@pytest.mark.parametrize(
    "value",
    [
        "2026-11-30T00:56:49Z",  # SeaweedFS, MinIO
        "2026-11-30T00:56:49.000Z",  # AWS
        "2026-11-30T00:56:49.123456Z",
        "2026-11-30T00:56:49.1234567Z",  # more digits than a microsecond
        "2026-11-30T01:56:49+01:00",
        "2026-11-30T00:56:49",  # no zone: botocore's own rule
        "Mon, 30 Nov 2026 00:56:49 GMT",  # a HEAD's Last-Modified header
        1_764_464_209,
        "1764464209",
    ],
)
def test_a_timestamp_is_the_instant_botocore_gives(value: object) -> None:
    ours, theirs = quick_timestamp(value), parse_timestamp(value)
    assert ours == theirs
    assert ours.utcoffset() == theirs.utcoffset()  # (None for botocore's reading of no zone)


def _listing_body(stamp: str) -> bytes:
    return (
        '<?xml version="1.0" encoding="UTF-8"?>'
        '<ListBucketResult xmlns="http://s3.amazonaws.com/doc/2006-03-01/">'
        "<Name>b</Name><Prefix>p/</Prefix><KeyCount>2</KeyCount><MaxKeys>1000</MaxKeys>"
        "<IsTruncated>false</IsTruncated>"
        f"<Contents><Key>p/a.parquet</Key><LastModified>{stamp}</LastModified>"
        '<ETag>"e1"</ETag><Size>10</Size><StorageClass>STANDARD</StorageClass></Contents>'
        f"<Contents><Key>p/b.parquet</Key><LastModified>{stamp}</LastModified>"
        '<ETag>"e2"</ETag><Size>20</Size><StorageClass>STANDARD</StorageClass></Contents>'
        "</ListBucketResult>"
    ).encode()


def _parsed(session: Any, body: bytes) -> Any:
    """``body`` as a ListObjectsV2 answer, parsed by the parser ``session``'s clients use."""
    model = botocore.session.Session().get_service_model("s3").operation_model("ListObjectsV2")
    parser = session.get_component("response_parser_factory").create_parser("rest-xml")
    response = {"body": body, "headers": {}, "status_code": 200}
    return asyncio.run(parser.parse(response, model.output_shape))


def test_an_s3fs_filesystem_gets_the_session_it_would_make_with_quick_timestamps() -> None:
    from aiobotocore.session import AioSession

    fs = s3fs.S3FileSystem(key="k", secret="s", profile=None, skip_instance_cache=True)
    assert fs.session is None
    assert quick_timestamps(fs) is fs
    assert isinstance(fs.session, AioSession)
    body = _listing_body("2026-11-30T00:56:49.000Z")
    ours = _parsed(fs.session, body)["Contents"]
    theirs = _parsed(AioSession(), body)["Contents"]
    assert ours == theirs  # keys, sizes, ETags, and the same instants
    assert [c["LastModified"].tzinfo for c in ours] == [datetime.timezone.utc] * 2
    assert all(c["LastModified"].tzinfo is not datetime.timezone.utc for c in theirs)


def test_a_session_of_the_callers_and_other_filesystems_are_left_alone() -> None:
    from aiobotocore.session import AioSession
    from fsspec.implementations.local import LocalFileSystem

    given = AioSession()
    fs = s3fs.S3FileSystem(session=given, skip_instance_cache=True)
    assert quick_timestamps(fs).session is given
    local = LocalFileSystem()
    assert quick_timestamps(local) is local
    assert not hasattr(local, "session")
