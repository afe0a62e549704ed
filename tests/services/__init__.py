"""Real storage servers for the test suite, started once per pytest session.

Each module starts one server on free loopback ports, waits until it answers (a bounded poll),
and stops it by PID (SIGTERM, then SIGKILL). Logs go to a file; when a server does not start,
`ServiceError` carries the tail of its log. What pip cannot install (Azurite, PostgreSQL) is
installed by ``scripts/services.sh``. `proxy` is a fault-injecting HTTP proxy for any of them.
"""

from __future__ import annotations

from pathlib import Path

from .process import ServiceError

ROOT = Path(__file__).resolve().parents[2]
"""The repository root."""

__all__ = ["ROOT", "ServiceError"]
