"""The loader's fsspec-style storage options as pylance takes them (`lance.storage`): S3's
translated, a local dataset none, what pylance cannot take refused by key, never by value."""

from __future__ import annotations

import pytest

from torch_dataloader_utils import InvalidArgumentError
from torch_dataloader_utils.fs import FileSystemSpec
from torch_dataloader_utils.lance.storage import lance_storage_options


def _options(protocol: str, options: dict[str, object]) -> dict[str, str] | None:
    return lance_storage_options(FileSystemSpec(protocol, options), "Lance dataset t.lance")


def test_s3_options_are_translated() -> None:
    options = {
        "key": "K",
        "secret": "S",
        "token": "T",
        "client_kwargs": {"endpoint_url": "http://127.0.0.1:9000", "region_name": "eu-west-1"},
    }
    assert _options("s3", options) == {
        "aws_access_key_id": "K",
        "aws_secret_access_key": "S",
        "aws_session_token": "T",
        "aws_endpoint": "http://127.0.0.1:9000",
        "aws_region": "eu-west-1",
        "allow_http": "true",
    }
    behind = _options("s3", {"endpoint_url": "https://store.example", "use_ssl": False})
    assert behind == {
        "aws_endpoint": "https://store.example",
        "aws_region": "us-east-1",
        "allow_http": "true",
    }
    assert _options("s3a", {"anon": True}) == {"aws_skip_signature": "true"}
    assert _options("s3", {}) is None
    assert _options("file", {"key": "ignored"}) is None


def test_what_pylance_cannot_take_is_refused_by_key() -> None:
    secret = "do-not-show-me"
    with pytest.raises(
        InvalidArgumentError, match=r"t.lance: .*\['config_kwargs', 'profile'\]"
    ) as caught:
        _options("s3", {"profile": secret, "config_kwargs": {}, "key": secret})
    assert secret not in str(caught.value)
    with pytest.raises(InvalidArgumentError, match=r"client_kwargs.verify"):
        _options("s3", {"client_kwargs": {"verify": False}})
    with pytest.raises(InvalidArgumentError, match=r"gs:// are not passed to pylance"):
        _options("gs", {"token": "anon"})
    assert _options("gs", {}) is None
