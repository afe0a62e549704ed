"""The storage of a table's files: its FileIO properties as fsspec storage options.

The catalog configures the table's FileIO (``s3.endpoint``, ``s3.access-key-id``, ...; a REST
catalog may hand out more, such as short-lived credentials, when the table is loaded). Data is
read through our `FileSystemSpec`, so those properties are translated to the options of the
fsspec filesystem of the table's protocol (s3fs, gcsfs, adlfs), which the native pyarrow
filesystems are built from too. Explicit ``storage_options`` win over them, key by key
(`fs.options.merge_options`, re-exported here).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any
from urllib.parse import urlsplit

from ..errors import InvalidArgumentError
from ..fs.options import MergedOptions, merge_options

__all__ = ["MergedOptions", "io_storage_options", "merge_options", "protocol_of"]

# Iceberg location schemes -> the fsspec protocol that reads them.
_PROTOCOLS = {
    "": "file",
    "file": "file",
    "s3": "s3",
    "s3a": "s3",
    "s3n": "s3",
    "gs": "gs",
    "gcs": "gs",
    "abfs": "abfs",
    "abfss": "abfss",
    "wasb": "abfs",
    "wasbs": "abfs",
    "hdfs": "hdfs",
    "viewfs": "hdfs",
    "oss": "oss",
}


def protocol_of(location: str) -> str:
    """The fsspec protocol of a table location (``s3a://b/t`` -> ``s3``).

    Raises:
        InvalidArgumentError: the scheme is not one Iceberg tables are stored under.
    """
    scheme = urlsplit(location).scheme.lower()
    if len(scheme) == 1:  # a Windows drive letter
        scheme = ""
    try:
        return _PROTOCOLS[scheme]
    except KeyError:
        raise InvalidArgumentError(
            f"table location {location}: unknown storage scheme {scheme!r}; known: "
            f"{sorted(s for s in _PROTOCOLS if s)}"
        ) from None


def _first(properties: Mapping[str, str], *keys: str) -> str | None:
    return next((properties[k] for k in keys if properties.get(k) not in (None, "")), None)


def _true(value: str | None) -> bool:
    return value is not None and value.strip().lower() in ("true", "1", "yes")


def _s3(properties: Mapping[str, str]) -> dict[str, Any]:
    options: dict[str, Any] = {}
    for key, names in (
        ("key", ("s3.access-key-id", "client.access-key-id")),
        ("secret", ("s3.secret-access-key", "client.secret-access-key")),
        ("token", ("s3.session-token", "client.session-token")),
        ("endpoint_url", ("s3.endpoint",)),
        ("profile", ("s3.profile-name", "client.profile-name")),
    ):
        value = _first(properties, *names)
        if value is not None:
            options[key] = value
    region = _first(properties, "s3.region", "client.region")
    if region is not None:
        options["client_kwargs"] = {"region_name": region}
    if _true(properties.get("s3.anonymous")):
        options["anon"] = True
    config: dict[str, Any] = {}
    if _true(properties.get("s3.path-style-access")):
        config["s3"] = {"addressing_style": "path"}
    elif _true(properties.get("s3.force-virtual-addressing")):
        config["s3"] = {"addressing_style": "virtual"}
    if properties.get("s3.connect-timeout"):
        config["connect_timeout"] = float(properties["s3.connect-timeout"])
    if properties.get("s3.request-timeout"):
        config["read_timeout"] = float(properties["s3.request-timeout"])
    if properties.get("s3.proxy-uri"):
        config["proxies"] = {
            "http": properties["s3.proxy-uri"],
            "https": properties["s3.proxy-uri"],
        }
    if config:
        options["config_kwargs"] = config
    return options


def _gcs(properties: Mapping[str, str]) -> dict[str, Any]:
    options: dict[str, Any] = {}
    for key, name in (
        ("project", "gcs.project-id"),
        ("token", "gcs.oauth2.token"),
        ("endpoint_url", "gcs.service.host"),
        ("default_location", "gcs.default-bucket-location"),
    ):
        if properties.get(name):
            options[key] = properties[name]
    if _true(properties.get("gcs.requester-pays")):
        options["requester_pays"] = True
    return options


def _adls(properties: Mapping[str, str]) -> dict[str, Any]:
    options: dict[str, Any] = {}
    for key, name in (
        ("connection_string", "adls.connection-string"),
        ("account_name", "adls.account-name"),
        ("account_key", "adls.account-key"),
        ("sas_token", "adls.sas-token"),
        ("tenant_id", "adls.tenant-id"),
        ("client_id", "adls.client-id"),
        ("client_secret", "adls.client-secret"),
        ("account_host", "adls.account-host"),
    ):
        if properties.get(name):
            options[key] = properties[name]
    # A catalog may vend SAS tokens per account: adls.sas-token.<account>.<host> = token.
    prefix = "adls.sas-token."
    for name, value in sorted(properties.items()):
        if name.startswith(prefix) and value and "sas_token" not in options:
            options["sas_token"] = value
            options.setdefault("account_name", name[len(prefix) :].split(".")[0])
    if _true(properties.get("adls.anon")):
        options["anon"] = True
    return options


_TRANSLATORS: dict[str, Callable[[Mapping[str, str]], dict[str, Any]]] = {
    "s3": _s3,
    "gs": _gcs,
    "abfs": _adls,
    "abfss": _adls,
}


def io_storage_options(protocol: str, properties: Mapping[str, str]) -> dict[str, Any]:
    """fsspec storage options for ``protocol`` from a table's FileIO ``properties``.

    Properties of other storages, and catalog-only ones (``uri``, ``warehouse``, ...), are left
    out. S3 remote signing (``s3.signer``) cannot be translated: reads would be refused.

    Raises:
        InvalidArgumentError: the properties ask for S3 remote request signing.
    """
    translate = _TRANSLATORS.get(protocol)
    if translate is None:
        return {}
    if (
        protocol == "s3"
        and properties.get("s3.signer")
        and not _first(properties, "s3.access-key-id", "client.access-key-id")
    ):
        raise InvalidArgumentError(
            "the catalog signs S3 requests remotely (s3.signer), which this library does not do; "
            "pass credentials in storage_options (key, secret) or in the catalog config "
            "(s3.access-key-id, s3.secret-access-key)"
        )
    return translate(properties)
