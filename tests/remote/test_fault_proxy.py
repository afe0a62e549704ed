"""The fault-injecting proxy (tests/services/proxy.py) in front of SeaweedFS's S3 port: it
forwards signed requests untouched, injects exactly the faults it is told to, counts them, and
s3fs with its own retries reads every object intact through it."""

from __future__ import annotations

import http.client
import time
from collections import Counter
from urllib.parse import urlsplit

import pytest

from tests.remote.conftest import BUCKET, FILES, PREFIX, MakeProxy, RemoteData
from tests.services.proxy import FaultProxy
from tests.services.seaweedfs import SeaweedFS

pytestmark = [pytest.mark.remote, pytest.mark.timeout(60)]

KEY = f"{PREFIX}/part-000.parquet"


def signed_get(
    seaweedfs: SeaweedFS, key: str, range_header: str | None = None
) -> tuple[str, dict[str, str]]:
    """A GET of ``key`` signed (SigV4) for the server itself: (path, headers incl. Host)."""
    from botocore.auth import S3SigV4Auth
    from botocore.awsrequest import AWSRequest
    from botocore.credentials import Credentials

    url = f"{seaweedfs.endpoint_url}/{BUCKET}/{key}"
    headers = {"Range": range_header} if range_header else {}
    request = AWSRequest(method="GET", url=url, headers=headers)
    credentials = Credentials(seaweedfs.access_key, seaweedfs.secret_key)
    S3SigV4Auth(credentials, "s3", seaweedfs.region).add_auth(request)
    signed = {k: str(v) for k, v in request.headers.items()}
    signed["Host"] = urlsplit(url).netloc  # the server's, not the proxy's: signatures verify
    return urlsplit(url).path, signed


class Client:
    """One keep-alive HTTP connection to the proxy (reopened after a drop)."""

    def __init__(self, proxy: FaultProxy, seaweedfs: SeaweedFS) -> None:
        self.proxy, self.seaweedfs = proxy, seaweedfs
        self.connection = http.client.HTTPConnection("127.0.0.1", proxy.port, timeout=10)

    def get(self, key: str = KEY, range_header: str | None = None) -> tuple[int, bytes]:
        path, headers = signed_get(self.seaweedfs, key, range_header)
        try:
            self.connection.request("GET", path, headers=headers)
            response = self.connection.getresponse()
            return response.status, response.read()
        except (http.client.HTTPException, ConnectionError):
            self.connection.close()  # the next request opens a new connection
            raise

    def close(self) -> None:
        self.connection.close()


def test_proxy_injects_what_it_is_told(
    s3_data: RemoteData, seaweedfs: SeaweedFS, fault_proxy: MakeProxy
) -> None:
    content = (s3_data.local / "part-000.parquet").read_bytes()
    proxy = fault_proxy(seed=3)
    client = Client(proxy, seaweedfs)
    try:
        # Forwarded untouched: a signed whole GET and ranged GETs on one keep-alive connection.
        assert client.get() == (200, content)
        assert client.get(range_header="bytes=100-199") == (206, content[100:200])
        assert client.get(range_header="bytes=-8") == (206, content[-8:])
        assert proxy.counts["connections"] == 1
        # SlowDown: a 503 with an S3 XML error body; the connection stays usable.
        proxy.configure(slowdown_rate=1.0)
        status, body = client.get()
        assert status == 503 and b"<Code>SlowDown</Code>" in body
        # Slow: forwarded after the delay.
        proxy.configure(slowdown_rate=0.0, slow_rate=1.0, delay=0.3)
        began = time.monotonic()
        assert client.get(range_header="bytes=0-9") == (206, content[:10])
        assert time.monotonic() - began >= 0.3
        # Dropped before any answer.
        proxy.configure(slow_rate=0.0, drop_rate=1.0, drop_mode="before")
        with pytest.raises((http.client.RemoteDisconnected, ConnectionError)):
            client.get()
        # Dropped mid-response: the head and half the body, then the end of the connection.
        proxy.configure(drop_mode="mid")
        with pytest.raises(http.client.IncompleteRead) as info:
            client.get()
        assert 0 < len(info.value.partial) < len(content)
        assert content.startswith(info.value.partial)
        # Only ranged GETs are eligible.
        proxy.configure(drop_rate=0.0, slowdown_rate=1.0, ranged_gets_only=True)
        assert client.get() == (200, content)
        assert client.get(range_header="bytes=0-9")[0] == 503
        # At most max_faults faults in all (5 so far).
        proxy.configure(max_faults=6)
        assert client.get(range_header="bytes=0-9")[0] == 503
        assert client.get(range_header="bytes=0-9") == (206, content[:10])
    finally:
        client.close()
    counts = proxy.counts
    assert counts["requests"] == 11
    assert (counts["slowdown"], counts["slow"], counts["drop"]) == (3, 1, 2)
    assert (counts["drop_before"], counts["drop_mid"]) == (1, 1)
    assert counts["forwarded"] == 11 - 3 - 2  # a slow request is forwarded too
    assert counts["connections"] == 3  # one at first, a new one after each drop
    outcomes = Counter(outcome for _, _, outcome in proxy.events)
    assert outcomes == {"forwarded": 6, "slowdown": 3, "drop_before": 1, "drop_mid": 1}


def test_proxy_rates_follow_the_seed(
    s3_data: RemoteData, seaweedfs: SeaweedFS, fault_proxy: MakeProxy
) -> None:
    """The same seed injects the same faults into the same request sequence."""
    outcomes = []
    for _ in range(2):
        proxy = fault_proxy(seed=11, slowdown_rate=0.3, slow_rate=0.2, delay=0.01)
        client = Client(proxy, seaweedfs)
        statuses = [client.get(range_header="bytes=0-15")[0] for _ in range(40)]
        client.close()
        outcomes.append(statuses)
        counts = proxy.counts
        assert counts["requests"] == 40
        assert counts["slowdown"] == statuses.count(503)
        assert counts["forwarded"] == statuses.count(206)
        assert 0 < counts["slowdown"] < 40 and 0 < counts["slow"] < 40
    assert outcomes[0] == outcomes[1]


def test_s3fs_retries_read_every_object_intact(
    s3_data: RemoteData, seaweedfs: SeaweedFS, fault_proxy: MakeProxy
) -> None:
    proxy = fault_proxy(seed=5, slowdown_rate=0.15, slow_rate=0.1, drop_rate=0.15, delay=0.05)
    fs = seaweedfs.filesystem(
        endpoint_url=proxy.endpoint_url,
        config_kwargs={"retries": {"max_attempts": 10, "mode": "standard"}},
    )
    for i in range(0, FILES, 2):
        name = f"part-{i:03d}.parquet"
        expected = (s3_data.local / name).read_bytes()
        key = f"{BUCKET}/{PREFIX}/{name}"
        assert fs.cat_file(key) == expected  # whole objects
        for start, end in ((0, 4), (1000, 5000), (len(expected) - 8, len(expected))):
            assert fs.cat_file(key, start=start, end=end) == expected[start:end]  # ranges
    listed = sorted(fs.ls(f"{BUCKET}/{PREFIX}", detail=False))
    assert listed == [f"{BUCKET}/{PREFIX}/_SUCCESS"] + [
        f"{BUCKET}/{PREFIX}/part-{i:03d}.parquet" for i in range(FILES)
    ]
    counts = proxy.counts
    assert counts["slowdown"] > 0 and counts["slow"] > 0 and counts["drop"] > 0, counts
    assert counts["requests"] == counts["forwarded"] + counts["slowdown"] + counts["drop"]
    # With faults off, every request is forwarded.
    proxy.disable()
    proxy.reset_counts()
    assert fs.cat_file(f"{BUCKET}/{KEY}", start=0, end=4) == b"PAR1"
    assert proxy.counts["requests"] == proxy.counts["forwarded"] >= 1
