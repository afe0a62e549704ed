"""Layering storage options (`FileSystemSpec.under`): options found for a source (an Iceberg
table's) under the user's, key by key; the user's backend, retries and options function."""

from __future__ import annotations

import pickle

from torch_dataloader_utils.fs import FileSystemSpec, RetryPolicy
from torch_dataloader_utils.fs.options import MergedOptions, merge_options

TABLE = {"key": "AK", "secret": "table", "client_kwargs": {"region_name": "eu-west-1"}}


def user_options() -> dict[str, object]:
    return {"secret": "fresh", "client_kwargs": {"verify": False}}


def test_under_layers_the_users_options_backend_and_retries() -> None:
    policy = RetryPolicy(max_attempts=2)
    own = FileSystemSpec("file", {"secret": "mine"}, backend="fsspec", retry=policy)
    spec = FileSystemSpec("s3", TABLE).under(own)
    assert spec.protocol == "s3" and spec.backend == "fsspec" and spec.retry == policy
    assert spec.retries is own.retries  # one count: dataset.storage_retries
    assert spec.storage_options == {**TABLE, "secret": "mine"}
    assert FileSystemSpec("s3", TABLE).under(FileSystemSpec("file")).storage_options == TABLE


def test_under_an_options_function_calls_it_in_each_process() -> None:
    spec = FileSystemSpec("s3", TABLE).under(FileSystemSpec("file", user_options))
    assert spec.refreshable and isinstance(spec.__getstate__()["storage_options"], MergedOptions)
    want = {
        "key": "AK",
        "secret": "fresh",
        "client_kwargs": {"region_name": "eu-west-1", "verify": False},
    }
    assert spec.storage_options == want
    assert pickle.loads(pickle.dumps(spec)).storage_options == want  # called again there
    assert "fresh" not in repr(spec) and "table" not in repr(spec.__getstate__())


def test_merge_options_of_functions_and_mappings() -> None:
    assert merge_options(TABLE, None) == TABLE and merge_options(TABLE, {}) == TABLE
    assert merge_options(user_options, None) is user_options
    merged = merge_options(user_options, {"secret": "given"})
    assert isinstance(merged, MergedOptions) and callable(merged)
    assert merged()["secret"] == "given"
