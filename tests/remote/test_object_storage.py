"""Reading Parquet from real object stores: S3 (SeaweedFS), GCS (fake-gcs-server), Azure Blob
(Azurite). Every row exactly once with real worker processes (fork and spawn) and shuffling;
listing, globs and brace patterns; errors that name the URL; no secret in any repr or state.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest
import torch

import torch_dataloader_utils as tdu
from tests.remote.conftest import BUCKET, FILES, PREFIX, ROWS, RemoteData
from tests.services.azurite import Azurite
from tests.services.seaweedfs import SeaweedFS
from torch_dataloader_utils import StructuredDataset

pytestmark = [
    pytest.mark.remote,
    pytest.mark.timeout(120),
    pytest.mark.filterwarnings("ignore:This DataLoader will create:UserWarning"),
]

BATCH = 700  # does not divide the 1500-row files: batches cross file boundaries
STORES = ("s3", "gcs", "azure")
BACKENDS = ("auto", "arrow", "fsspec")


def data_for(request: pytest.FixtureRequest, store: str) -> RemoteData:
    data: RemoteData = request.getfixturevalue(f"{store}_data")
    return data


def read_ids(loader: Any) -> list[int]:
    """Every id the loader delivers, in order; checks each row's columns against its id."""
    seen: list[int] = []
    for batch in loader:
        ids = batch["id"]
        assert ids.dtype == torch.int64
        torch.testing.assert_close(batch["x"], ids.to(torch.float64) * 0.5)
        torch.testing.assert_close(batch["y"], (ids % 97).to(torch.float32))
        assert batch["name"] == [f"row-{i}" for i in ids.tolist()]
        seen.extend(ids.tolist())
    return seen


# --- every row exactly once ------------------------------------------------------------------


# fork: every store with every backend. spawn costs seconds a test (each worker imports torch),
# and what it adds is pickling the options into fresh processes: each store once, each backend
# once (auto is native for these options).
EXACTLY_ONCE = [
    *[
        (store, backend, "fork")
        for store in STORES
        for backend in BACKENDS
        if (store, backend) != ("azure", "arrow")  # refused under fork: see below
    ],
    ("s3", "auto", "spawn"),
    ("gcs", "fsspec", "spawn"),
    ("azure", "arrow", "spawn"),
]


@pytest.mark.parametrize(
    ("store", "backend", "ctx"), EXACTLY_ONCE, ids=["-".join(case) for case in EXACTLY_ONCE]
)
def test_every_row_exactly_once(
    request: pytest.FixtureRequest, store: str, backend: str, ctx: str
) -> None:
    data = data_for(request, store)
    loader = tdu.create_dataloader(
        data.url,
        format="parquet",
        batch_size=BATCH,
        shuffle=True,
        storage_options=data.storage_options,
        num_workers=2,
        multiprocessing_context=ctx,
        storage_backend=backend,
    )
    seen = read_ids(loader)
    assert Counter(seen) == Counter(data.ids)  # every row exactly once, nothing else
    assert len(seen) == ROWS
    assert seen != sorted(seen)  # shuffled


def test_native_azure_is_refused_in_forked_workers(azure_data: RemoteData) -> None:
    # The Azure C++ SDK shares its connection pool with forked children: measured, forked
    # workers got each other's responses. A clear error instead of wrong bytes; spawn works
    # (above), and "auto" reads Azure through adlfs. The parent reads natively first: planning
    # alone reads footers through adlfs (at the listed sizes), building no native client.
    in_process = tdu.create_dataloader(
        azure_data.url,
        batch_size=BATCH,
        storage_options=azure_data.storage_options,
        storage_backend="arrow",
        num_workers=0,
    )
    assert Counter(read_ids(in_process)) == Counter(azure_data.ids)
    loader = tdu.create_dataloader(
        azure_data.url,
        batch_size=BATCH,
        storage_options=azure_data.storage_options,
        storage_backend="arrow",
        num_workers=2,
        multiprocessing_context="fork",
    )
    with pytest.raises(tdu.InvalidArgumentError, match='multiprocessing_context="spawn"'):
        read_ids(loader)
    auto = tdu.create_dataloader(
        azure_data.url, batch_size=BATCH, storage_options=azure_data.storage_options
    )
    assert not auto.dataset.fs.native


# --- listing ---------------------------------------------------------------------------------


def plan_files(dataset: StructuredDataset) -> list[str]:
    return sorted({chunk.path for chunk in dataset.plan.chunks})


@pytest.mark.parametrize(
    ("pattern", "indices"),
    [
        ("", range(FILES)),  # the directory: every data file, not _SUCCESS
        ("/", range(FILES)),  # with a trailing slash
        ("/*.parquet", range(FILES)),
        ("/part-00[1-3].parquet", [1, 2, 3]),
        ("/part-{000,002,007}.parquet", [0, 2, 7]),
        ("/part-{004..006}.parquet", [4, 5, 6]),
    ],
)
def test_s3_listing(s3_data: RemoteData, pattern: str, indices: range | list[int]) -> None:
    dataset = StructuredDataset(
        s3_data.url + pattern, batch_size=BATCH, storage_options=s3_data.storage_options
    )
    expected = [f"{BUCKET}/{PREFIX}/part-{i:03d}.parquet" for i in indices]
    assert plan_files(dataset) == expected
    per_file = ROWS // FILES
    assert dataset.plan.num_rows == per_file * len(expected)


def test_s3_glob_reads_exactly_its_files(s3_data: RemoteData) -> None:
    loader = tdu.create_dataloader(
        s3_data.url + "/part-{000,003}.parquet",
        batch_size=BATCH,
        shuffle=True,
        storage_options=s3_data.storage_options,
        num_workers=0,
    )
    per_file = ROWS // FILES
    expected = s3_data.ids[0:per_file] + s3_data.ids[3 * per_file : 4 * per_file]
    assert Counter(read_ids(loader)) == Counter(expected)


# --- errors ----------------------------------------------------------------------------------


@pytest.mark.parametrize("store", STORES)
@pytest.mark.parametrize("missing", ["/part-999.parquet", "/no-such-dir", "-missing/x.parquet"])
def test_missing_object_raises_not_found(
    request: pytest.FixtureRequest, store: str, missing: str
) -> None:
    data = data_for(request, store)
    url = data.url + missing
    with pytest.raises(tdu.StorageNotFoundError) as info:
        tdu.create_dataloader(url, batch_size=BATCH, storage_options=data.storage_options)
    assert url in str(info.value)


def test_missing_bucket_raises_not_found(s3_data: RemoteData) -> None:
    url = "s3://tdu-no-such-bucket/ds"
    with pytest.raises(tdu.StorageNotFoundError) as info:
        tdu.create_dataloader(url, batch_size=BATCH, storage_options=s3_data.storage_options)
    assert url in str(info.value)


def test_s3_wrong_secret_raises_storage_error(s3_data: RemoteData, seaweedfs: SeaweedFS) -> None:
    wrong = "tdu-wrong-secret-0123456789"
    options = {**s3_data.storage_options, "secret": wrong}
    with pytest.raises(tdu.StorageError) as info:
        tdu.create_dataloader(s3_data.url, batch_size=BATCH, storage_options=options)
    # SeaweedFS answers 403 SignatureDoesNotMatch; s3fs raises PermissionError.
    assert isinstance(info.value, tdu.StoragePermissionError), repr(info.value)
    message = str(info.value)
    assert s3_data.url in message
    assert wrong not in message and seaweedfs.secret_key not in message


def test_azure_wrong_key_raises_storage_error(azure_data: RemoteData, azurite: Azurite) -> None:
    wrong = azurite.account_key[:-8] + "AAAAAAA="
    options = {"connection_string": azurite.connection_string.replace(azurite.account_key, wrong)}
    with pytest.raises(tdu.StorageError) as info:
        tdu.create_dataloader(azure_data.url, batch_size=BATCH, storage_options=options)
    message = str(info.value)
    assert azure_data.url in message
    assert wrong not in message and azurite.account_key not in message


# --- secrets stay out of reprs and states ----------------------------------------------------


@pytest.mark.parametrize("store", ["s3", "azure"])
def test_no_secret_in_repr_or_state(request: pytest.FixtureRequest, store: str) -> None:
    data = data_for(request, store)
    secret = (
        request.getfixturevalue("seaweedfs").secret_key
        if store == "s3"
        else request.getfixturevalue("azurite").account_key
    )
    loader = tdu.create_dataloader(
        data.url,
        batch_size=BATCH,
        shuffle=True,
        storage_options=data.storage_options,
        num_workers=0,
    )
    texts = [repr(loader.dataset), str(loader.dataset), repr(loader.dataset.fs)]
    texts += [repr(loader.state_dict()), str(loader.state_dict())]
    iterator = iter(loader)
    next(iterator)  # mid-epoch state
    texts += [repr(loader.state_dict()), str(loader.state_dict())]
    del iterator
    for text in texts:
        assert secret not in text, text
