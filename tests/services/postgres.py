"""PostgreSQL: ``initdb`` plus ``pg_ctl`` from the system's server binaries (apt, installed by
``scripts/services.sh``), a throwaway cluster on a free port, trust auth on loopback only.

PostgreSQL refuses to run as root, so as root every command runs through
``runuser -u postgres --``, and the cluster lives in a fresh folder under the system temp dir
(pytest's own temp dirs are private to root) owned by that user. The server's output goes to a
log under the session's temp dir. It stops by PID with SIGINT ("fast" shutdown: it does not
wait for clients to disconnect), then SIGKILL.
"""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import signal
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from .ports import HOST, free_port
from .process import ServerProcess, ServiceError, log_tail

__all__ = ["Postgres", "postgres_bin_dir", "start_postgres"]

DATABASE = "iceberg"
USER = "postgres"


def postgres_bin_dir() -> Path | None:
    """The folder of ``initdb`` and ``pg_ctl``: on PATH, else the newest /usr/lib/postgresql."""
    found = shutil.which("initdb")
    if found and shutil.which("pg_ctl", path=str(Path(found).parent)):
        return Path(found).parent
    candidates = glob.glob("/usr/lib/postgresql/*/bin/initdb")

    def version(path: str) -> tuple[int, ...]:
        text = Path(path).parent.parent.name
        return tuple(int(p) for p in text.split(".") if p.isdigit())

    for path in sorted(candidates, key=version, reverse=True):
        if (Path(path).parent / "pg_ctl").exists():
            return Path(path).parent
    return None


@dataclass
class Postgres:
    """A running PostgreSQL with an empty database ``iceberg``."""

    process: ServerProcess
    port: int
    cluster_dir: Path
    database: str = DATABASE
    user: str = USER

    @property
    def uri(self) -> str:
        """SQLAlchemy URI of the database (what pyiceberg's SqlCatalog takes)."""
        return f"postgresql+psycopg2://{self.user}@{HOST}:{self.port}/{self.database}"

    def stop(self) -> None:
        self.process.stop()
        shutil.rmtree(self.cluster_dir, ignore_errors=True)


def _run(argv: list[str], log_path: Path, what: str, timeout: float) -> None:
    with log_path.open("ab") as log:
        log.write(f"$ {subprocess.list2cmdline(argv)}\n".encode())
        log.flush()
        try:
            done = subprocess.run(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                timeout=timeout,
                check=False,
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise ServiceError(f"PostgreSQL: {what} failed: {exc}\n{log_tail(log_path)}") from exc
    if done.returncode != 0:
        raise ServiceError(
            f"PostgreSQL: {what} exited with status {done.returncode}; "
            f"last lines of {log_path}:\n{log_tail(log_path)}"
        )


def start_postgres(workdir: Path, *, timeout: float = 30.0) -> Postgres:
    """initdb a fresh cluster, start it on a free port, and create database ``iceberg``.

    Raises:
        ServiceError: no server binaries (run scripts/services.sh), no ``postgres`` user to run
            it as root, or it did not start (with its log's tail).
    """
    bin_dir = postgres_bin_dir()
    if bin_dir is None:
        raise ServiceError("PostgreSQL: no initdb/pg_ctl found: run scripts/services.sh")
    workdir.mkdir(parents=True, exist_ok=True)
    log_path = workdir / "postgres.log"
    prefix: list[str] = []
    account = None
    if os.geteuid() == 0:
        try:
            account = pwd.getpwnam(USER)
        except KeyError as exc:
            raise ServiceError("PostgreSQL: running as root needs a `postgres` user") from exc
        runuser = shutil.which("runuser")
        if runuser is None:
            raise ServiceError("PostgreSQL: running as root needs `runuser` (util-linux)")
        prefix = [runuser, "-u", USER, "--"]
    cluster = Path(tempfile.mkdtemp(prefix="tdu-pg-"))
    if account is not None:
        os.chown(cluster, account.pw_uid, account.pw_gid)
    data = cluster / "data"
    port = free_port()
    try:
        _run(
            [
                *prefix,
                str(bin_dir / "initdb"),
                "-D",
                str(data),
                "-U",
                USER,
                "--auth=trust",
                "-E",
                "UTF8",
                "--locale=C.UTF-8",
                "--no-sync",
            ],
            log_path,
            "initdb",
            timeout,
        )
        options = f"-h {HOST} -p {port} -k {cluster} -c fsync=off -c full_page_writes=off"
        # No -l: the server writes to pg_ctl's stdout, i.e. our log file (root may write it).
        _run(
            [
                *prefix,
                str(bin_dir / "pg_ctl"),
                "-D",
                str(data),
                "-w",
                "-t",
                str(int(timeout)),
                "-o",
                options,
                "start",
            ],
            log_path,
            "pg_ctl start",
            timeout + 5,
        )
        pid = int((data / "postmaster.pid").read_text().split()[0])
    except BaseException:
        _kill_cluster(data)
        shutil.rmtree(cluster, ignore_errors=True)
        raise
    process = ServerProcess("PostgreSQL", pid, log_path, stop_signal=signal.SIGINT)
    server = Postgres(process, port, cluster)
    try:
        _create_database(port)
    except Exception as exc:
        server.stop()
        raise ServiceError(f"PostgreSQL: cannot create database {DATABASE!r}: {exc}") from exc
    return server


def _kill_cluster(data: Path) -> None:
    try:
        pid = int((data / "postmaster.pid").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return
    ServerProcess("PostgreSQL", pid, data / "unused.log", stop_signal=signal.SIGINT).stop(5.0)


def _create_database(port: int) -> None:
    import psycopg2

    connection = psycopg2.connect(host=HOST, port=port, user=USER, dbname="postgres")
    try:
        connection.autocommit = True
        with connection.cursor() as cursor:
            cursor.execute(f"CREATE DATABASE {DATABASE}")
    finally:
        connection.close()
