"""Start a server process, wait until it answers, stop it by PID, show the tail of its log."""

from __future__ import annotations

import atexit
import contextlib
import os
import shlex
import signal
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

__all__ = [
    "ServerProcess",
    "ServiceError",
    "http_answers",
    "log_tail",
    "pid_alive",
    "start_process",
    "wait_until",
]


class ServiceError(RuntimeError):
    """A server could not be installed, started or prepared; the message says why."""


def log_tail(path: Path, lines: int = 40) -> str:
    """The last ``lines`` lines of the log at ``path`` (or a note that there is none)."""
    try:
        text = path.read_text(errors="replace")
    except OSError as exc:
        return f"<no log at {path}: {exc}>"
    tail = text.splitlines()[-lines:]
    return "\n".join(tail) if tail else "<empty log>"


def pid_alive(pid: int) -> bool:
    """True while process ``pid`` runs (a zombie counts as gone)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # not our child: nobody may reap it, so a zombie would answer kill(pid, 0) forever
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return stat.rsplit(")", 1)[-1].split()[0] != "Z"


def http_answers(url: str, timeout: float = 1.0) -> bool:
    """True when ``url`` answers HTTP at all (any status; an error status is an answer)."""
    try:
        with urllib.request.urlopen(url, timeout=timeout):
            return True
    except urllib.error.HTTPError:
        return True
    except (OSError, ValueError):
        return False


class ServerProcess:
    """A running server: its PID, its log, and how to stop it.

    Args:
        name: for messages.
        pid: the server's process id (the process signals go to).
        log_path: where its output goes.
        popen: the `subprocess.Popen` when the server is our child (reaped on stop).
        stop_signal: the polite signal (SIGTERM; PostgreSQL's fast shutdown is SIGINT).
    """

    def __init__(
        self,
        name: str,
        pid: int,
        log_path: Path,
        *,
        popen: subprocess.Popen[bytes] | None = None,
        stop_signal: int = signal.SIGTERM,
    ) -> None:
        self.name = name
        self.pid = pid
        self.log_path = log_path
        self.popen = popen
        self.stop_signal = stop_signal
        self.start_seconds: float | None = None
        self.stop_seconds: float | None = None
        atexit.register(self.stop)  # a backstop if the session ends without its finalizers

    def alive(self) -> bool:
        """True while the server runs."""
        if self.popen is not None:
            return self.popen.poll() is None
        return pid_alive(self.pid)

    def _wait_gone(self, timeout: float) -> bool:
        if self.popen is not None:
            try:
                self.popen.wait(timeout)
            except subprocess.TimeoutExpired:
                return False
            return True
        return wait_until(lambda: not pid_alive(self.pid), timeout)

    def stop(self, timeout: float = 15.0) -> None:
        """Stop by PID: the polite signal, then SIGKILL after ``timeout`` seconds. Idempotent."""
        start = time.monotonic()
        if self.alive():
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, self.stop_signal)
            if not self._wait_gone(timeout):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(self.pid, signal.SIGKILL)
                self._wait_gone(5.0)
        elif self.popen is not None:
            self.popen.poll()  # reap
        if self.stop_seconds is None:
            self.stop_seconds = time.monotonic() - start
        atexit.unregister(self.stop)

    def describe(self) -> str:
        """``name (pid N)``: the last lines of its log, for failure messages."""
        return f"{self.name} (pid {self.pid}); last lines of {self.log_path}:\n" + log_tail(
            self.log_path
        )

    def __repr__(self) -> str:
        return f"ServerProcess({self.name!r}, pid={self.pid}, log={str(self.log_path)!r})"


def wait_until(check: Callable[[], bool], timeout: float, interval: float = 0.05) -> bool:
    """Poll ``check`` until it is true or ``timeout`` seconds pass; the last result."""
    deadline = time.monotonic() + timeout
    while True:
        if check():
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(interval)


def start_process(
    name: str,
    argv: Sequence[str],
    *,
    log_path: Path,
    ready: Callable[[], bool],
    env: Mapping[str, str] | None = None,
    cwd: Path | None = None,
    timeout: float = 30.0,
) -> ServerProcess:
    """Start ``argv`` (output to ``log_path``) and wait up to ``timeout`` s until ``ready()``.

    The server runs in a session of its own (a Ctrl-C in the terminal does not reach it; the
    session fixture stops it).

    Raises:
        ServiceError: it exited or did not become ready in time (stopped, with its log's tail).
    """
    log_path.parent.mkdir(parents=True, exist_ok=True)
    command = shlex.join(argv)
    with log_path.open("ab") as log:
        log.write(f"$ {command}\n".encode())
        log.flush()
        try:
            popen = subprocess.Popen(
                list(argv),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=None if env is None else dict(env),
                cwd=cwd,
                start_new_session=True,
            )
        except OSError as exc:
            raise ServiceError(f"{name}: cannot run {command}: {exc}") from exc
    server = ServerProcess(name, popen.pid, log_path, popen=popen)
    started = time.monotonic()
    ok = wait_until(lambda: popen.poll() is not None or ready(), timeout)
    if not ok or popen.poll() is not None:
        server.stop(timeout=5.0)
        why = (
            f"exited with status {popen.returncode}"
            if popen.returncode is not None and ok
            else f"did not answer within {timeout:.0f} s"
        )
        raise ServiceError(f"{name} {why}: {command}\n{server.describe()}")
    server.start_seconds = time.monotonic() - started
    return server
