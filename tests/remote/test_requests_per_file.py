"""Metadata requests per file, counted by a proxy in front of the store: planning asks nothing
about a file the listing of its prefix described (its footer is read at the listed size), and a
pass over the data asks once per file, one request that is both the file's identity check and
its open. SeaweedFS (S3) through pyarrow's native client and s3fs, fake-gcs-server through
gcsfs (pyarrow's GCS client does not get through the proxy), Azurite through both."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any
from urllib.parse import unquote

import pytest

import torch_dataloader_utils as tdu
from tests.format_files import write_orc_ipc_source
from tests.services.seaweedfs import SeaweedFS

from .conftest import FILES, MakeProxy, RemoteData

pytestmark = [
    pytest.mark.remote,
    pytest.mark.timeout(120),
    pytest.mark.filterwarnings("ignore:This DataLoader will create:UserWarning"),
]

Events = list[tuple[str, str, str]]


def _metadata_requests(store: str, events: Events) -> Counter[str]:
    """The metadata requests among ``events`` (a proxy's), by the object's name: HEADs on S3
    and Azure, an object's JSON resource on GCS (its bytes come from ``alt=media``)."""
    found: Counter[str] = Counter()
    for method, target, _ in events:
        path, _, query = target.partition("?")
        if store == "gcs":
            asked = method == "GET" and "/o/" in path and "alt=media" not in query
        else:
            asked = method == "HEAD"
        if asked:
            found[unquote(path).rsplit("/", 1)[-1]] += 1
    return found


def _proxied(request: pytest.FixtureRequest, store: str, proxy_of: MakeProxy) -> Any:
    """The store's dataset, its storage options, and a proxy in front of the store."""
    data: RemoteData = request.getfixturevalue(f"{store}_data")
    if store == "s3":
        proxy = proxy_of()
        return data, {**data.storage_options, "endpoint_url": proxy.endpoint_url}, proxy
    if store == "gcs":
        server = request.getfixturevalue("gcs_server")
        proxy = proxy_of(upstream=("127.0.0.1", server.port))
        return data, {**data.storage_options, "endpoint_url": proxy.endpoint_url}, proxy
    server = request.getfixturevalue("azurite")
    proxy = proxy_of(upstream=("127.0.0.1", server.port))
    connection = server.connection_string.replace(f":{server.port}/", f":{proxy.port}/")
    return data, {"connection_string": connection}, proxy


@pytest.mark.parametrize(
    ("store", "backend", "workers"),
    [
        ("s3", "arrow", 0),
        ("s3", "fsspec", 0),
        ("s3", "arrow", 2),
        ("s3", "fsspec", 2),
        ("gcs", "fsspec", 0),
        ("azure", "arrow", 0),
        ("azure", "fsspec", 0),
    ],
    ids=str,
)
def test_one_metadata_request_per_file_and_pass_none_while_planning(
    request: pytest.FixtureRequest,
    fault_proxy: MakeProxy,
    store: str,
    backend: str,
    workers: int,
) -> None:
    data, storage, proxy = _proxied(request, store, fault_proxy)
    loader = tdu.create_dataloader(
        data.url,
        batch_size=500,
        storage_options=storage,
        storage_backend=backend,
        num_workers=workers,
        multiprocessing_context="fork" if workers else None,
    )
    names = {f"part-{i:03d}.parquet" for i in range(FILES)}
    planning = _metadata_requests(store, proxy.events)
    # The listing told each file's size and version: footers are read at that size.
    assert not names & set(planning), planning
    for epoch in range(2):
        proxy.reset_counts()
        loader.set_epoch(epoch)
        assert Counter(i for b in loader for i in b["id"].tolist()) == Counter(data.ids)
        # One request per file and pass: its check (asked again each pass), which its open
        # shares. (Each file is one chunk here, read by one worker.) gcsfs's ``info`` asks
        # for the object a second time when its probe for a directory of that name, which
        # races the first, finds none.
        asked = _metadata_requests(store, proxy.events)
        assert set(asked) == names, asked
        assert max(asked.values()) <= (2 if store == "gcs" else 1), asked


def test_an_orc_file_read_through_fsspec_is_read_ahead(
    seaweedfs: SeaweedFS, fault_proxy: MakeProxy, tmp_path: Path
) -> None:
    """Opening with a known size keeps fsspec's reading ahead: ORC reads each stream of a
    stripe apart, which would be a request each (`fs.ranges.RangeFile`'s ``ahead``)."""
    bucket = "tdu-ahead"
    seaweedfs.create_bucket(bucket)
    fs = seaweedfs.filesystem()
    local = write_orc_ipc_source(tmp_path, "orc", [(3000, 250), (400, 64)])
    for path in sorted(local.iterdir()):
        fs.put_file(str(path), f"{bucket}/orc/{path.name}")
    proxy = fault_proxy()
    loader = tdu.create_dataloader(
        f"s3://{bucket}/orc",
        format="orc",
        batch_size=128,
        storage_options=seaweedfs.s3fs_options(endpoint_url=proxy.endpoint_url),
        storage_backend="fsspec",
        num_workers=0,
    )
    proxy.reset_counts()
    assert sum(len(b["id"]) for b in loader) == 3400
    methods = Counter(method for method, _, _ in proxy.events)
    # 19 stripes: read stream by stream without reading ahead, 211 ranged GETs.
    assert methods == Counter({"HEAD": 2, "GET": methods["GET"]}) and methods["GET"] <= 8, methods
