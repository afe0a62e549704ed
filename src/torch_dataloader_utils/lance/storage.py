"""The loader's storage options (fsspec's keys) as pylance's (object_store's keys).

A dataset on S3 is opened with the same ``storage_options`` as the rest of the loader's data
(``key``, ``secret``, ``endpoint_url``, ...): each process translates its own options when it
opens the dataset, so they never travel in the plan. Other protocols (GCS, Azure) are opened
with pylance's own configuration (its environment variables): options for them are refused
rather than silently ignored.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..errors import InvalidArgumentError
from ..fs import FileSystemSpec

__all__ = ["lance_storage_options"]

# fsspec (s3fs) keys -> object_store's.
_S3 = {
    "key": "aws_access_key_id",
    "secret": "aws_secret_access_key",
    "token": "aws_session_token",
    "endpoint_url": "aws_endpoint",
    "region_name": "aws_region",
}
_S3_PROTOCOLS = ("s3", "s3a")


def _s3(options: Mapping[str, Any], label: str) -> dict[str, str]:
    client = dict(options.get("client_kwargs") or {})
    unknown = sorted(k for k in options if k not in {*_S3, "anon", "client_kwargs", "use_ssl"})
    unknown += [f"client_kwargs.{k}" for k in sorted(client) if k not in _S3]
    if unknown:
        raise InvalidArgumentError(
            f"{label}: storage option(s) {unknown} cannot be passed to pylance, which opens "
            f"Lance datasets; it takes {sorted(_S3)}, anon, use_ssl and client_kwargs "
            "endpoint_url and region_name (or its own AWS_* environment variables)"
        )
    out = {
        ours: str(value)
        for key, ours in _S3.items()
        if (value := options.get(key, client.get(key))) is not None
    }
    if options.get("anon"):
        out["aws_skip_signature"] = "true"
    endpoint = out.get("aws_endpoint", "")
    if endpoint.startswith("http://") or options.get("use_ssl") is False:
        out["allow_http"] = "true"
    if endpoint:
        out.setdefault("aws_region", "us-east-1")  # (S3-compatible stores sign with some region)
    return out


def lance_storage_options(fs: FileSystemSpec, label: str) -> dict[str, str] | None:
    """``fs``'s storage options as pylance takes them (``None``: none to pass).

    Raises:
        InvalidArgumentError: an option has no pylance equivalent (the message names the
            keys, never their values).
    """
    if fs.is_local:
        return None
    options = fs.storage_options
    if fs.protocol in _S3_PROTOCOLS:
        return _s3(options, label) or None
    if options:
        raise InvalidArgumentError(
            f"{label}: storage options for {fs.protocol}:// are not passed to pylance, which "
            f"opens Lance datasets ({sorted(options)}); configure it with its own environment "
            "variables instead"
        )
    return None
