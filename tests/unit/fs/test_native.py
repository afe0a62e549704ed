"""fsspec-style storage options -> pyarrow's native S3/GCS/Azure filesystems.

Constructing a pyarrow filesystem does no network I/O, so these build real filesystem objects
and read their configuration back from ``__reduce__`` (the arguments pyarrow pickles them with).
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pyarrow.fs as pafs
import pytest

from torch_dataloader_utils.errors import InvalidArgumentError
from torch_dataloader_utils.fs import FileSystemSpec
from torch_dataloader_utils.fs.native import NATIVE_PROTOCOLS, native_filesystem, untranslatable

SECRET = "wJalrXUtnFEMI-s3cr3t-value"


def config(fs: pafs.FileSystem) -> dict[str, Any]:
    """The constructor arguments pyarrow pickles ``fs`` with."""
    _, args = fs.__reduce__()
    (kwargs,) = args
    assert isinstance(kwargs, dict)
    return kwargs


# --- protocols ---------------------------------------------------------------------------------


def test_protocol_aliases_map_to_their_family() -> None:
    assert {p for p, f in NATIVE_PROTOCOLS.items() if f == "s3"} == {"s3", "s3a"}
    assert {p for p, f in NATIVE_PROTOCOLS.items() if f == "gcs"} == {"gs", "gcs"}
    assert {p for p, f in NATIVE_PROTOCOLS.items() if f == "azure"} == {"abfs", "abfss", "az"}
    for protocol in ("s3", "s3a"):
        assert isinstance(native_filesystem(protocol, {}), pafs.S3FileSystem)
    for protocol in ("gs", "gcs"):
        assert isinstance(native_filesystem(protocol, {"token": "anon"}), pafs.GcsFileSystem)
    for protocol in ("abfs", "abfss", "az"):
        fs = native_filesystem(protocol, {"account_name": "acct", "account_key": "a2V5"})
        assert isinstance(fs, pafs.AzureFileSystem)


@pytest.mark.parametrize("protocol", ["memory", "file", "http", "hdfs"])
def test_protocol_without_native_filesystem_is_refused(protocol: str) -> None:
    with pytest.raises(InvalidArgumentError, match=repr(protocol)) as info:
        native_filesystem(protocol, {})
    assert "no pyarrow native filesystem" in str(info.value)
    # untranslatable: every key (none translates), or a marker when there are no keys.
    assert untranslatable(protocol, {}) == ["<protocol>"]
    assert untranslatable(protocol, {"b": 1, "a": SECRET}) == ["a", "b"]


# --- S3 ----------------------------------------------------------------------------------------


def test_s3_credentials_region_endpoint_and_timeouts() -> None:
    fs = native_filesystem(
        "s3",
        {
            "key": "AKIAEXAMPLE",
            "secret": SECRET,
            "token": "session-tok",
            "endpoint_url": "http://localhost:9000",
            "region_name": "eu-west-1",
        },
        timeout=7.5,
    )
    assert isinstance(fs, pafs.S3FileSystem)
    assert fs.region == "eu-west-1"
    c = config(fs)
    assert c["access_key"] == "AKIAEXAMPLE"
    assert c["secret_key"] == SECRET
    assert c["session_token"] == "session-tok"
    assert c["endpoint_override"] == "localhost:9000"
    assert c["scheme"] == "http"
    assert c["anonymous"] is False
    assert c["connect_timeout"] == 7.5
    assert c["request_timeout"] == 7.5


def test_s3_endpoint_and_region_from_client_kwargs() -> None:
    fs = native_filesystem(
        "s3",
        {
            "anon": True,
            "client_kwargs": {"endpoint_url": "https://minio.internal:9443", "region_name": "r1"},
        },
    )
    c = config(fs)
    assert fs.region == "r1"
    assert (c["endpoint_override"], c["scheme"]) == ("minio.internal:9443", "https")
    assert c["anonymous"] is True
    # Top-level keys win over client_kwargs.
    fs = native_filesystem(
        "s3",
        {
            "endpoint_url": "http://top:1",
            "region_name": "top-region",
            "client_kwargs": {"endpoint_url": "http://inner:2", "region_name": "inner-region"},
        },
    )
    assert fs.region == "top-region"
    assert config(fs)["endpoint_override"] == "top:1"


def test_s3_defaults() -> None:
    fs = native_filesystem("s3", {})
    c = config(fs)
    assert fs.region == "us-east-1"
    assert c["endpoint_override"] == ""
    assert c["scheme"] == "https"
    assert c["anonymous"] is False
    # No timeout given: pyarrow's defaults (-1) stay.
    assert c["connect_timeout"] == -1.0
    assert c["request_timeout"] == -1.0


def test_s3_use_ssl_false_means_http_without_endpoint() -> None:
    assert config(native_filesystem("s3", {"use_ssl": False}))["scheme"] == "http"
    assert config(native_filesystem("s3", {"use_ssl": True}))["scheme"] == "https"
    # An endpoint URL carries its own scheme, which wins over use_ssl.
    c = config(native_filesystem("s3", {"use_ssl": False, "endpoint_url": "https://h:1"}))
    assert c["scheme"] == "https"


def test_s3_endpoint_without_scheme_defaults_to_https() -> None:
    c = config(native_filesystem("s3", {"endpoint_url": "localhost:9000"}))
    assert (c["endpoint_override"], c["scheme"]) == ("localhost:9000", "https")


def test_s3_anon_with_keys_is_a_pyarrow_value_error() -> None:
    # Documented behaviour, not ours: pyarrow refuses the combination (s3fs would ignore the keys).
    with pytest.raises(ValueError, match="anonymous"):
        native_filesystem("s3", {"anon": True, "key": "AK", "secret": SECRET})


def test_s3_untranslatable_keys_are_named_sorted_values_never_shown() -> None:
    options = {
        "key": "AK",
        "secret": SECRET,
        "requester_pays": True,
        "config_kwargs": {"max_pool_connections": 50},
        "client_kwargs": {"verify": SECRET, "endpoint_url": "http://h:1", "aws_ca": 1},
    }
    assert untranslatable("s3", options) == [
        "requester_pays",
        "client_kwargs.aws_ca",
        "client_kwargs.verify",
        "config_kwargs.max_pool_connections",
    ]

    with pytest.raises(InvalidArgumentError) as info:
        native_filesystem("s3a", options)
    message = str(info.value)
    assert "requester_pays" in message and "client_kwargs.verify" in message
    assert "s3a://" in message
    assert SECRET not in message
    assert untranslatable("s3", {"key": "AK", "secret": SECRET, "client_kwargs": {}}) == []


# --- GCS ---------------------------------------------------------------------------------------


def test_gcs_anonymous_project_endpoint_and_retry_limit() -> None:
    fs = native_filesystem(
        "gs",
        {"token": "anon", "project": "proj-1", "endpoint_url": "http://localhost:4443"},
        timeout=12,
    )
    assert isinstance(fs, pafs.GcsFileSystem)
    c = config(fs)
    assert c["anonymous"] is True
    assert c["project_id"] == "proj-1"
    assert (c["endpoint_override"], c["scheme"]) == ("localhost:4443", "http")
    assert c["retry_time_limit"] == timedelta(seconds=12)
    assert config(native_filesystem("gcs", {"anon": True}))["anonymous"] is True
    # Without options: default credentials, pyarrow's own retry limit.
    c = config(native_filesystem("gcs", {}))
    assert c["anonymous"] is False
    assert c["retry_time_limit"] is None


@pytest.mark.parametrize("token", ["google_default", "/path/creds.json", {"type": "x"}])
def test_gcs_token_other_than_anon_is_untranslatable(token: object) -> None:
    assert untranslatable("gs", {"token": token}) == ["token"]
    with pytest.raises(InvalidArgumentError, match="token"):
        native_filesystem("gs", {"token": token})
    assert untranslatable("gs", {"token": "anon", "requests_timeout": 3}) == ["requests_timeout"]


# --- Azure -------------------------------------------------------------------------------------


def test_azure_account_key_and_service_principal() -> None:
    c = config(native_filesystem("abfs", {"account_name": "acct", "account_key": SECRET}))
    assert (c["account_name"], c["account_key"]) == ("acct", SECRET)
    c = config(
        native_filesystem(
            "az",
            {
                "account_name": "acct",
                "client_id": "cid",
                "client_secret": SECRET,
                "tenant_id": "tid",
            },
        )
    )
    assert (c["client_id"], c["client_secret"], c["tenant_id"]) == ("cid", SECRET, "tid")
    c = config(native_filesystem("abfs", {"account_name": "acct", "sas_token": "sv=1&sig=x"}))
    assert c["sas_token"] == "?sv=1&sig=x"


def test_azure_azurite_connection_string() -> None:
    key = "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="
    connection = (
        "DefaultEndpointsProtocol=http;AccountName=devstoreaccount1;"
        f"AccountKey={key};BlobEndpoint=http://127.0.0.1:10000/devstoreaccount1;"
    )
    c = config(native_filesystem("abfs", {"connection_string": connection}))
    assert c["account_name"] == "devstoreaccount1"
    assert c["account_key"] == key  # the base64 padding ('=') survives the key=value split
    assert c["blob_storage_authority"] == c["dfs_storage_authority"] == "127.0.0.1:10000"
    assert c["blob_storage_scheme"] == c["dfs_storage_scheme"] == "http"


def test_azure_connection_string_with_sas_and_explicit_account() -> None:
    connection = (
        "BlobEndpoint=https://acct.blob.core.windows.net;SharedAccessSignature=sv=2&sig=a%3D"
    )
    c = config(native_filesystem("abfs", {"connection_string": connection, "account_name": "acct"}))
    assert c["account_name"] == "acct"
    assert c["sas_token"] == "?sv=2&sig=a%3D"  # pyarrow appends it to the URL as given
    assert c["blob_storage_authority"] == "acct.blob.core.windows.net"
    assert c["blob_storage_scheme"] == "https"


def test_azure_without_account_is_refused() -> None:
    with pytest.raises(InvalidArgumentError, match="account_name"):
        native_filesystem("abfs", {"account_key": SECRET})
    with pytest.raises(InvalidArgumentError) as info:
        native_filesystem("abfs", {"connection_string": f"AccountKey={SECRET}"})
    assert SECRET not in str(info.value)


def test_azure_anonymous_is_untranslatable() -> None:
    # pyarrow's AzureFileSystem has no anonymous mode: without credentials it uses
    # DefaultAzureCredential, so anon=True must not silently become "default credentials".
    assert "anon" in untranslatable("abfs", {"account_name": "acct", "anon": True})
    with pytest.raises(InvalidArgumentError, match="anon"):
        native_filesystem("abfs", {"account_name": "acct", "anon": True})
    spec = FileSystemSpec("abfs", {"account_name": "acct", "anon": True})
    assert not spec.native  # "auto" falls back to adlfs, which honours anon
    assert untranslatable("abfs", {"account_name": "acct", "default_fill_cache": False}) == [
        "default_fill_cache"
    ]


# --- through FileSystemSpec (backend selection) ------------------------------------------------


def test_spec_auto_uses_native_when_every_option_translates() -> None:
    spec = FileSystemSpec("s3", {"key": "AK", "secret": SECRET, "region_name": "ap-south-1"})
    assert spec.native
    fs = spec.arrow()
    assert isinstance(fs, pafs.S3FileSystem)
    assert fs.region == "ap-south-1"
    # The native filesystem tries once; the request timeout comes from the retry policy.
    assert config(fs)["request_timeout"] == spec.retry.request_timeout


def test_spec_auto_falls_back_to_fsspec_on_untranslatable_option() -> None:
    spec = FileSystemSpec("s3", {"anon": True, "client_kwargs": {"verify": False}})
    assert not spec.native
    fs = spec.arrow()
    assert isinstance(fs, pafs.PyFileSystem)
    assert type(spec.fsspec()).__name__ == "S3FileSystem"  # s3fs's, not pyarrow's


def test_spec_arrow_backend_refuses_untranslatable_and_fsspec_backend_never_native() -> None:
    strict = FileSystemSpec("s3", {"requester_pays": True}, backend="arrow")
    assert strict.native  # the backend is forced; building it says why it cannot be
    with pytest.raises(InvalidArgumentError, match="requester_pays"):
        strict.arrow()
    assert not FileSystemSpec("s3", {}, backend="fsspec").native
    assert not FileSystemSpec("memory", {}).native
    assert FileSystemSpec("file").native
    with pytest.raises(InvalidArgumentError, match="'memory'"):
        FileSystemSpec("memory", backend="arrow").arrow()


def test_native_reads_only_where_reads_go_native_to_an_object_store() -> None:
    """`FileSystemSpec.native_reads`: the filesystem pyarrow's own readers may read through."""
    assert isinstance(
        FileSystemSpec("s3", {"key": "AK", "secret": SECRET}).native_reads(), pafs.S3FileSystem
    )
    assert FileSystemSpec("s3", {"key": "AK"}, backend="fsspec").native_reads() is None
    untranslated = FileSystemSpec("s3", {"anon": True, "client_kwargs": {"verify": False}})
    assert untranslated.native_reads() is None
    assert FileSystemSpec("file").native_reads() is None  # (local footers: read as they are)
    assert FileSystemSpec("memory").native_reads() is None


def test_s3_addressing_style_translates_with_an_endpoint() -> None:
    path = {"config_kwargs": {"s3": {"addressing_style": "path"}}}
    # pyarrow addresses by path only with an endpoint; on AWS itself it uses virtual hosts.
    assert untranslatable("s3", path) == ["config_kwargs.s3.addressing_style"]
    assert untranslatable("s3", {**path, "endpoint_url": "http://127.0.0.1:9000"}) == []
    virtual = {"config_kwargs": {"s3": {"addressing_style": "virtual"}}}
    assert untranslatable("s3", virtual) == []
    assert native_filesystem("s3", virtual).__reduce__()[1][0]["force_virtual_addressing"]
