"""A Lance dataset on S3 (a SeaweedFS server started here): planned and read with the loader's
own fsspec-style ``storage_options``, which each process translates for pylance, in forked
workers too (through their reader processes); options pylance cannot take are refused."""

from __future__ import annotations

from pathlib import Path

import lance
import pytest

import torch_dataloader_utils as tdu
from tests.lance.data import live_ids, write_dataset
from tests.remote.conftest import seaweedfs  # noqa: F401  (the session's server)
from tests.services.seaweedfs import SeaweedFS
from torch_dataloader_utils import InvalidArgumentError
from torch_dataloader_utils.fs import FileSystemSpec
from torch_dataloader_utils.lance.storage import lance_storage_options

pytestmark = [
    pytest.mark.remote,
    pytest.mark.timeout(180),
    pytest.mark.filterwarnings("ignore:This DataLoader will create:UserWarning"),
    pytest.mark.filterwarnings("ignore:lance is not fork-safe:UserWarning"),
]


@pytest.fixture(scope="module")
def server(seaweedfs: SeaweedFS) -> SeaweedFS:  # noqa: F811  (the session's: fails in CI when down)
    seaweedfs.create_bucket("lance")
    return seaweedfs


def test_a_dataset_on_s3_is_read_with_the_loaders_storage_options(
    server: SeaweedFS, tmp_path: Path
) -> None:
    local = write_dataset(tmp_path / "s.lance")
    uri = "s3://lance/s.lance"
    options = server.s3fs_options()
    translated = lance_storage_options(FileSystemSpec("s3", options), "here")
    assert translated is not None and translated["allow_http"] == "true"
    # A copy of the dataset's version 4 (deletion files) written to S3 by pylance itself.
    lance.write_dataset(lance.dataset(local).to_table(), uri, storage_options=translated)
    lance.dataset(uri, storage_options=translated).delete("id % 5 = 0")
    expected = [i for i in live_ids(4) if i % 5]
    for workers in (0, 2):
        loader = tdu.create_dataloader(
            uri,
            format="lance",
            storage_options=options,
            batch_size=16,
            shuffle=True,
            num_workers=workers,
            multiprocessing_context="fork" if workers else None,
            timeout=60,
        )
        assert dict(loader.dataset.plan.details)["version"] == "2"
        got = [i for batch in loader for i in batch["id"].tolist()]
        assert sorted(got) == expected


def test_options_pylance_cannot_take_are_refused_by_name(server: SeaweedFS) -> None:
    options = {**server.s3fs_options(), "config_kwargs": {"s3": {"addressing_style": "path"}}}
    with pytest.raises(InvalidArgumentError, match=r"\['config_kwargs'\] cannot be passed"):
        tdu.create_dataloader("s3://lance/x.lance", format="lance", storage_options=options)
