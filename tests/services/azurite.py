"""Azurite (Azure Blob emulator), installed from npm into ``.services/node`` by
``scripts/services.sh`` and run with that folder's ``node_modules``.

Both ``--skipApiVersionCheck`` (the current Azure SDK's API version is newer than Azurite's)
and ``--disableTelemetry`` are required. adlfs works with the connection-string form only.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from . import ROOT
from .ports import HOST, free_port
from .process import ServerProcess, ServiceError, http_answers, start_process

__all__ = ["ACCOUNT_KEY", "ACCOUNT_NAME", "Azurite", "azurite_script", "start_azurite"]

NODE_DIR = ROOT / ".services" / "node"
ACCOUNT_NAME = "devstoreaccount1"
# Azurite's fixed, public development key (documented by Microsoft; not a secret).
ACCOUNT_KEY = (
    "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="
)


def azurite_script() -> Path | None:
    """The ``azurite-blob`` entry script in ``.services/node``, if installed."""
    script = NODE_DIR / "node_modules" / ".bin" / "azurite-blob"
    return script.resolve() if script.exists() else None


@dataclass
class Azurite:
    """A running Azurite blob service at `endpoint_url` (account ``devstoreaccount1``)."""

    process: ServerProcess
    port: int
    account_name: str = ACCOUNT_NAME
    account_key: str = field(default=ACCOUNT_KEY, repr=False)

    @property
    def endpoint_url(self) -> str:
        return f"http://{HOST}:{self.port}/{self.account_name}"

    @property
    def connection_string(self) -> str:
        return (
            f"DefaultEndpointsProtocol=http;AccountName={self.account_name};"
            f"AccountKey={self.account_key};BlobEndpoint={self.endpoint_url};"
        )

    def adlfs_options(self) -> dict[str, Any]:
        """fsspec/adlfs ``storage_options`` (``abfs://container/path`` URLs)."""
        return {"connection_string": self.connection_string}

    def pyarrow_options(self) -> dict[str, Any]:
        """Keyword arguments for ``pyarrow.fs.AzureFileSystem``."""
        authority = f"{HOST}:{self.port}"
        return {
            "account_name": self.account_name,
            "account_key": self.account_key,
            "blob_storage_authority": authority,
            "dfs_storage_authority": authority,
            "blob_storage_scheme": "http",
            "dfs_storage_scheme": "http",
        }

    def filesystem(self) -> Any:
        """A fresh ``adlfs.AzureBlobFileSystem`` on this server."""
        import adlfs

        return adlfs.AzureBlobFileSystem(skip_instance_cache=True, **self.adlfs_options())

    def create_container(self, name: str) -> None:
        fs = self.filesystem()
        if not fs.exists(name):
            fs.mkdir(name)

    def stop(self) -> None:
        self.process.stop()


def start_azurite(workdir: Path, *, timeout: float = 30.0) -> Azurite:
    """Start Azurite's blob service, data and log under ``workdir``, on a free port.

    Raises:
        ServiceError: Node.js or Azurite is missing (run scripts/services.sh), or it did not
            start (with its log's tail).
    """
    script = azurite_script()
    if script is None:
        raise ServiceError(f"Azurite is not installed in {NODE_DIR}: run scripts/services.sh")
    node = shutil.which("node")
    if node is None:
        raise ServiceError("Azurite needs Node.js (`node` is not on PATH): run scripts/services.sh")
    workdir.mkdir(parents=True, exist_ok=True)
    port = free_port()
    argv = [
        node,
        str(script),
        "--blobHost",
        HOST,
        "--blobPort",
        str(port),
        "--location",
        str(workdir / "data"),
        "--disableTelemetry",
        "--skipApiVersionCheck",
        "--silent",
    ]
    process = start_process(
        "Azurite",
        argv,
        log_path=workdir / "azurite.log",
        cwd=workdir,
        timeout=timeout,
        ready=lambda: http_answers(f"http://{HOST}:{port}/{ACCOUNT_NAME}?comp=list"),
    )
    return Azurite(process, port)
