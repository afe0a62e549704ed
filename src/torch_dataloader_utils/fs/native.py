"""pyarrow's native S3/GCS/Azure filesystems, built from the same fsspec-style storage options.

Why both: pyarrow's native filesystems issue range reads in parallel from C++ threads, while
an fsspec file object serialises them, one request in flight
(docs/adr/0006-object-storage-reads.md). Listing stays on fsspec (it has globs); reading goes
native where the options translate. Options are translated key by key; a key we cannot
translate means the user configured something native would ignore, so
``storage_backend="auto"`` falls back to fsspec and ``"arrow"`` refuses.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from datetime import timedelta
from typing import Any
from urllib.parse import urlsplit

import pyarrow.fs as pafs

from ..errors import InvalidArgumentError

__all__ = ["NATIVE_PROTOCOLS", "native_filesystem", "untranslatable"]

# fsspec protocol names -> the native family.
NATIVE_PROTOCOLS = {
    "s3": "s3",
    "s3a": "s3",
    "gs": "gcs",
    "gcs": "gcs",
    "abfs": "azure",
    "abfss": "azure",
    "az": "azure",
}

# Our own retries count and log every retry (fs/retry.py); the native filesystem's own retries
# would be invisible, so it tries once.
_ONE_ATTEMPT = 1

_S3_KEYS = {
    "key",
    "secret",
    "token",
    "anon",
    "endpoint_url",
    "client_kwargs",
    "region_name",
    "use_ssl",
    "config_kwargs",
}
_S3_CLIENT_KEYS = ("endpoint_url", "region_name")
_GCS_KEYS = {"token", "project", "endpoint_url", "anon"}
_AZURE_KEYS = {
    "account_name",
    "account_key",
    "connection_string",
    "sas_token",
    "client_id",
    "client_secret",
    "tenant_id",
    "anon",
}


def _endpoint(url: str) -> tuple[str, str]:
    """``http://host:port`` -> (``host:port``, ``http``)."""
    parts = urlsplit(url if "://" in url else f"https://{url}")
    return parts.netloc, parts.scheme or "https"


def _s3(options: Mapping[str, Any], timeout: float | None) -> pafs.FileSystem:
    client = dict(options.get("client_kwargs") or {})
    kwargs: dict[str, Any] = {
        "access_key": options.get("key"),
        "secret_key": options.get("secret"),
        "session_token": options.get("token"),
        "anonymous": bool(options.get("anon", False)),
        "region": options.get("region_name") or client.get("region_name"),
        "retry_strategy": pafs.AwsStandardS3RetryStrategy(max_attempts=_ONE_ATTEMPT),
        "request_timeout": timeout,
        "connect_timeout": timeout,
    }
    style = ((options.get("config_kwargs") or {}).get("s3") or {}).get("addressing_style")
    if style == "virtual":
        kwargs["force_virtual_addressing"] = True
    endpoint = options.get("endpoint_url") or client.get("endpoint_url")
    if endpoint:
        kwargs["endpoint_override"], kwargs["scheme"] = _endpoint(str(endpoint))
        # S3-compatible stores sign with some region; without an endpoint pyarrow takes AWS's
        # own (AWS_REGION, the profile), as s3fs does.
        kwargs["region"] = kwargs["region"] or "us-east-1"
    elif options.get("use_ssl") is False:
        kwargs["scheme"] = "http"
    return pafs.S3FileSystem(**{k: v for k, v in kwargs.items() if v is not None})


def _gcs(options: Mapping[str, Any], timeout: float | None) -> pafs.FileSystem:
    token = options.get("token")
    anonymous = token == "anon" or bool(options.get("anon", False))
    if token is not None and not anonymous:
        raise InvalidArgumentError("a gcsfs token other than 'anon' has no native equivalent")
    kwargs: dict[str, Any] = {
        "anonymous": anonymous,
        "project_id": options.get("project"),
        # pyarrow's GCS client retries inside this time limit; ours count on top of it.
        "retry_time_limit": timedelta(seconds=timeout) if timeout is not None else None,
    }
    endpoint = options.get("endpoint_url")
    if endpoint:
        kwargs["endpoint_override"], kwargs["scheme"] = _endpoint(str(endpoint))
    return pafs.GcsFileSystem(**{k: v for k, v in kwargs.items() if v is not None})


def _connection_string(text: str) -> dict[str, str]:
    pairs = (item.partition("=") for item in text.split(";") if item)
    return {key: value for key, _, value in pairs}


def _azure(options: Mapping[str, Any], timeout: float | None) -> pafs.FileSystem:
    del timeout  # pyarrow's Azure filesystem takes no timeout
    kwargs: dict[str, Any] = {
        "account_name": options.get("account_name"),
        "account_key": options.get("account_key"),
        "sas_token": options.get("sas_token"),
        "client_id": options.get("client_id"),
        "client_secret": options.get("client_secret"),
        "tenant_id": options.get("tenant_id"),
    }
    if options.get("connection_string"):
        parsed = _connection_string(str(options["connection_string"]))
        kwargs["account_name"] = parsed.get("AccountName", kwargs["account_name"])
        kwargs["account_key"] = parsed.get("AccountKey", kwargs["account_key"])
        if parsed.get("SharedAccessSignature"):
            kwargs["sas_token"] = parsed["SharedAccessSignature"]
        endpoint = parsed.get("BlobEndpoint")
        if endpoint:
            # Emulators put the account in the endpoint's path (http://host:port/account);
            # pyarrow adds it itself for a non-default authority.
            authority, scheme = _endpoint(endpoint)
            kwargs.update(
                blob_storage_authority=authority,
                dfs_storage_authority=authority,
                blob_storage_scheme=scheme,
                dfs_storage_scheme=scheme,
            )
    if kwargs["sas_token"] and not str(kwargs["sas_token"]).startswith("?"):
        # pyarrow appends the token to the URL as given: without "?" it lands in the path.
        kwargs["sas_token"] = f"?{kwargs['sas_token']}"
    if not kwargs["account_name"]:
        raise InvalidArgumentError("Azure storage options need account_name or connection_string")
    return pafs.AzureFileSystem(**{k: v for k, v in kwargs.items() if v is not None})


_Builder = Callable[[Mapping[str, Any], float | None], pafs.FileSystem]
_BUILDERS: dict[str, tuple[set[str], _Builder]] = {
    "s3": (_S3_KEYS, _s3),
    "gcs": (_GCS_KEYS, _gcs),
    "azure": (_AZURE_KEYS, _azure),
}


def untranslatable(protocol: str, options: Mapping[str, Any]) -> list[str]:
    """The option keys a native filesystem for ``protocol`` cannot honour (all when it has
    none)."""
    family = NATIVE_PROTOCOLS.get(protocol)
    if family is None:
        return sorted(options) or ["<protocol>"]
    known, _ = _BUILDERS[family]
    unknown = sorted(k for k in options if k not in known)
    if family == "s3":
        client = options.get("client_kwargs") or {}
        unknown += [f"client_kwargs.{k}" for k in sorted(client) if k not in _S3_CLIENT_KEYS]
        config = dict(options.get("config_kwargs") or {})
        s3_config = dict(config.pop("s3", None) or {})
        style = s3_config.pop("addressing_style", "auto")
        # Only the addressing style translates (Iceberg's s3.path-style-access sets it).
        unknown += [f"config_kwargs.{k}" for k in sorted(config)]
        unknown += [f"config_kwargs.s3.{k}" for k in sorted(s3_config)]
        endpoint = options.get("endpoint_url") or client.get("endpoint_url")
        # pyarrow addresses buckets by path only behind an endpoint; on AWS itself it uses
        # virtual hosts, which a user asking for path style may not be able to use.
        if style not in ("auto", "path", "virtual") or (style == "path" and not endpoint):
            unknown.append("config_kwargs.s3.addressing_style")
    if family == "gcs" and options.get("token") not in (None, "anon"):
        unknown.append("token")
    if family == "azure" and options.get("anon"):
        unknown.append("anon")  # pyarrow's Azure filesystem has no anonymous access
    return unknown


def native_filesystem(
    protocol: str, options: Mapping[str, Any], *, timeout: float | None = None
) -> pafs.FileSystem:
    """pyarrow's native filesystem for ``protocol`` configured from fsspec-style ``options``.

    Raises:
        InvalidArgumentError: the protocol has no native filesystem, or an option does not
            translate (the message names the keys, never their values).
    """
    family = NATIVE_PROTOCOLS.get(protocol)
    if family is None:
        raise InvalidArgumentError(
            f'storage_backend="arrow": protocol {protocol!r} has no pyarrow native filesystem; '
            f"native ones: {sorted(NATIVE_PROTOCOLS)}"
        )
    unknown = untranslatable(protocol, options)
    if unknown:
        raise InvalidArgumentError(
            f'storage_backend="arrow": storage option(s) {unknown} have no pyarrow equivalent '
            f'for {protocol}://; use storage_backend="fsspec" (or "auto")'
        )
    _, build = _BUILDERS[family]
    return build(options, timeout)
