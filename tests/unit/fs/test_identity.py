"""A file's identity check against what the store reports: one metadata request, or none when
one made since the reader began is at hand; fields matched whatever their case."""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

import pytest

from torch_dataloader_utils.errors import FileChangedError
from torch_dataloader_utils.fs import FileSystemSpec
from torch_dataloader_utils.fs.identity import check_identity
from torch_dataloader_utils.fs.reported import Reported


class Store(FileSystemSpec):
    """An S3 spec whose metadata requests answer ``answers`` in turn, counted."""

    def __init__(self, *answers: Mapping[str, Any], native: bool = False) -> None:
        super().__init__("s3", backend="arrow" if native else "fsspec")
        self.answers = list(answers)
        self.asked = 0
        self.reported = Reported()

    def head(self, path: str, *, since: float | None = None) -> Mapping[str, Any]:
        if since is not None and (found := self.reported.since(path, since)) is not None:
            return found
        return self.info(path)

    def info(self, path: str) -> Mapping[str, Any]:
        self.asked += 1
        answer = self.answers.pop(0)
        self.reported.record(path, answer)
        return answer


def test_a_check_asks_once_and_refuses_a_changed_file_naming_it() -> None:
    store = Store({"size": 10, "ETag": '"a"'}, {"size": 10, "ETag": '"b"'})
    check_identity("b/k", (10, 'ETag="a"'), store)
    with pytest.raises(FileChangedError, match=r"s3://b/k: changed after planning: ETag"):
        check_identity("b/k", (10, 'ETag="a"'), store)
    assert store.asked == 2


def test_a_request_made_since_the_reader_began_serves_its_check() -> None:
    store = Store({"size": 10, "ETag": '"a"'}, {"size": 12, "ETag": '"b"'})
    began = time.monotonic()
    store.head("b/k")  # the reader's open of the file
    check_identity("b/k", (10, 'ETag="a"'), store, since=began)
    assert store.asked == 1
    # A later reader (a later pass) asks again, and sees the file changed.
    with pytest.raises(FileChangedError, match="10 bytes then, 12 now"):
        check_identity("b/k", (10, 'ETag="a"'), store, since=time.monotonic())
    assert store.asked == 2


def test_a_version_field_matches_whatever_its_case() -> None:
    # adlfs lists "etag"; a native open reports "ETag".
    store = Store({"size": 10, "ETag": '"0x1"'}, {"size": 10, "ETag": '"0x2"'})
    check_identity("c/k", (10, 'etag="0x1"'), store)
    with pytest.raises(FileChangedError, match="etag was"):
        check_identity("c/k", (10, 'etag="0x1"'), store)


def test_a_field_a_native_open_does_not_report_is_asked_of_fsspec() -> None:
    # s3fs pins LastModified when there is no ETag; a native open names it Last-Modified.
    store = Store(
        {"size": 10, "Last-Modified": "x"}, {"size": 10, "LastModified": "t2"}, native=True
    )
    with pytest.raises(FileChangedError, match="LastModified was t1"):
        check_identity("b/k", (10, "LastModified=t1"), store)
    assert store.asked == 2


def test_reported_sizes_and_answers() -> None:
    reported = Reported()
    reported.listed([("a", 5), ("b", 0)])  # 0: the listing did not say
    assert (reported.size("a"), reported.size("b"), reported.size("c")) == (5, None, None)
    before = time.monotonic()
    reported.record("b", {"size": 7, "ETag": "e"})
    assert reported.size("b") == 7
    assert reported.since("b", before) == {"size": 7, "ETag": "e"}
    assert reported.since("b", time.monotonic() + 1) is None
    assert reported.since("a", before) is None  # a listing is no metadata request
