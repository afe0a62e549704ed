"""A listing on S3 through the library (its timestamps parsed by the standard library,
`fs.s3_timestamps`) says what a plain s3fs listing says: the same files, sizes, ETags and
instants; a HEAD's HTTP date too."""

from __future__ import annotations

import datetime

import pytest
import s3fs

from tests.remote.conftest import BUCKET, PREFIX, RemoteData
from torch_dataloader_utils.fs.listing import list_files
from torch_dataloader_utils.fs.spec import FileSystemSpec

pytestmark = [pytest.mark.remote, pytest.mark.timeout(120)]


def test_a_listing_through_the_library_says_what_s3fs_says(s3_data: RemoteData) -> None:
    s3fs.S3FileSystem.clear_instance_cache()  # (not one another test made and connected)
    spec = FileSystemSpec("s3", s3_data.storage_options)
    ours = spec.fsspec()
    folder = f"{BUCKET}/{PREFIX}"
    found = ours.find(folder, detail=True)
    plain = s3_data.fs.find(folder, detail=True)
    assert len(found) == len(list(s3_data.local.iterdir())) > 1
    assert found == plain  # keys, sizes, ETags, and the same instants
    stamps = [info["LastModified"] for info in found.values()]
    assert {s.tzinfo for s in stamps} == {datetime.timezone.utc}  # parsed by ours
    listed = list_files(s3_data.url, spec)
    assert [(f.path, f.size, f.version) for f in listed] == [
        (p, info["size"], f"ETag={info['ETag']}")
        for p, info in sorted(plain.items())
        if not p.rsplit("/", 1)[1].startswith("_")  # (a marker, `_SUCCESS`: not data)
    ]
    one = next(iter(found))
    ours.invalidate_cache()
    s3_data.fs.invalidate_cache()
    assert ours.info(one)["LastModified"] == s3_data.fs.info(one)["LastModified"]  # a HEAD
