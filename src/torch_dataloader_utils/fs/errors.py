"""Translate third-party storage errors into our hierarchy, by type."""

from __future__ import annotations

from ..errors import StorageError, StorageNotFoundError, StoragePermissionError

__all__ = ["translate_os_error"]


def translate_os_error(exc: OSError, url: str) -> StorageError:
    """Map an ``OSError`` raised while touching ``url`` to the matching `StorageError`.

    The caller raises the result ``from exc``.
    """
    if isinstance(exc, StorageError):
        return exc
    detail = exc.strerror or str(exc) or type(exc).__name__
    if isinstance(exc, FileNotFoundError):
        return StorageNotFoundError(f"{url}: not found ({detail})")
    if isinstance(exc, PermissionError):
        return StoragePermissionError(f"{url}: permission denied ({detail})")
    return StorageError(f"{url}: {detail}")
