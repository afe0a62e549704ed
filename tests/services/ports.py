"""Free TCP ports on the loopback interface."""

from __future__ import annotations

import socket
from contextlib import ExitStack

__all__ = ["HOST", "free_port", "free_ports"]

HOST = "127.0.0.1"


def free_ports(count: int, *, offset: int | None = None) -> list[int]:
    """``count`` distinct ports that were free a moment ago (bind port 0, then close).

    All sockets stay open until every port is chosen, so the ports differ. With ``offset``,
    ``port + offset`` was free too (for servers that derive a second port from the first).
    """
    ports: list[int] = []
    with ExitStack() as stack:
        while len(ports) < count:
            sock = stack.enter_context(socket.socket(socket.AF_INET, socket.SOCK_STREAM))
            sock.bind((HOST, 0))
            port = int(sock.getsockname()[1])
            if offset is not None:
                try:
                    other = stack.enter_context(socket.socket(socket.AF_INET, socket.SOCK_STREAM))
                    other.bind((HOST, port + offset))
                except (OSError, OverflowError):
                    continue  # the derived port is taken or out of range: keep looking
            ports.append(port)
    return ports


def free_port() -> int:
    """One port that was free a moment ago."""
    return free_ports(1)[0]
