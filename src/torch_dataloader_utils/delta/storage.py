"""The storage of a Delta table as deltalake (delta-rs) reads its log: our fsspec storage
options translated to delta-rs's ``storage_options`` (``AWS_ENDPOINT_URL``, ...)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..fs import FileSystemSpec

__all__ = ["delta_storage_options", "table_uri"]


def table_uri(location: str, fs: FileSystemSpec) -> str:
    """The table's location as deltalake opens it: an absolute local path, or a URL."""
    bare = fs.strip(location).rstrip("/") or "/"
    return bare if fs.is_local else f"{fs.protocol}://{bare}"


def _s3(options: Mapping[str, Any]) -> dict[str, str]:
    out: dict[str, str] = {}
    for ours, theirs in (
        ("key", "AWS_ACCESS_KEY_ID"),
        ("secret", "AWS_SECRET_ACCESS_KEY"),
        ("token", "AWS_SESSION_TOKEN"),
        ("endpoint_url", "AWS_ENDPOINT_URL"),
        ("profile", "AWS_PROFILE"),
    ):
        if options.get(ours):
            out[theirs] = str(options[ours])
    client = options.get("client_kwargs") or {}
    endpoint = out.get("AWS_ENDPOINT_URL") or client.get("endpoint_url")
    if endpoint:
        out["AWS_ENDPOINT_URL"] = str(endpoint)
        if str(endpoint).startswith("http://"):
            out["AWS_ALLOW_HTTP"] = "true"
    region = client.get("region_name") or options.get("region")
    if region:
        out["AWS_REGION"] = str(region)
    if options.get("anon"):
        out["AWS_SKIP_SIGNATURE"] = "true"
    config = options.get("config_kwargs") or {}
    if (config.get("s3") or {}).get("addressing_style") == "virtual":
        out["AWS_VIRTUAL_HOSTED_STYLE_REQUEST"] = "true"
    return out


def _gcs(options: Mapping[str, Any]) -> dict[str, str]:
    token = options.get("token")
    if isinstance(token, str) and token not in ("anon", "google_default", "cloud", "browser"):
        return {"GOOGLE_SERVICE_ACCOUNT": token}
    return {}


def _azure(options: Mapping[str, Any]) -> dict[str, str]:
    out: dict[str, str] = {}
    for ours, theirs in (
        ("account_name", "AZURE_STORAGE_ACCOUNT_NAME"),
        ("account_key", "AZURE_STORAGE_ACCOUNT_KEY"),
        ("sas_token", "AZURE_STORAGE_SAS_TOKEN"),
        ("connection_string", "AZURE_STORAGE_CONNECTION_STRING"),
        ("tenant_id", "AZURE_STORAGE_TENANT_ID"),
        ("client_id", "AZURE_STORAGE_CLIENT_ID"),
        ("client_secret", "AZURE_STORAGE_CLIENT_SECRET"),
    ):
        if options.get(ours):
            out[theirs] = str(options[ours])
    return out


_TRANSLATORS = {"s3": _s3, "gs": _gcs, "gcs": _gcs, "abfs": _azure, "abfss": _azure, "az": _azure}


def delta_storage_options(fs: FileSystemSpec) -> dict[str, str]:
    """``fs``'s storage options as delta-rs takes them (local: none). Options already in
    delta-rs's upper-case form are passed on as they are."""
    if fs.is_local:
        return {}
    options = fs.storage_options
    translate = _TRANSLATORS.get(fs.protocol)
    out = translate(options) if translate is not None else {}
    out.update({k: str(v) for k, v in options.items() if k.isupper() and isinstance(v, str)})
    return out
