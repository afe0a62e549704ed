"""Arrow IPC files and streams: `IpcFormat` (`format`), planned from message headers only
(`messages`)."""

from __future__ import annotations

from .format import IpcFormat

__all__ = ["IpcFormat"]
