"""Translate third-party storage errors into our hierarchy: by type, else by the status in
pyarrow's message (see `retry`)."""

from __future__ import annotations

from ..errors import StorageError, StorageNotFoundError, StoragePermissionError
from .retry import is_missing, is_refused, scrub

__all__ = ["translate_os_error"]


def translate_os_error(exc: OSError, url: str) -> StorageError:
    """Map an ``OSError`` raised while touching ``url`` to the matching `StorageError`.

    The caller raises the result ``from exc``.
    """
    if isinstance(exc, StorageError):
        return exc
    detail = scrub(exc.strerror or str(exc) or type(exc).__name__)
    # pyarrow's native filesystems raise plain OSError: read the status from the message.
    if is_missing(exc):
        return StorageNotFoundError(f"{url}: not found ({detail})")
    if is_refused(exc):
        return StoragePermissionError(f"{url}: permission denied ({detail})")
    return StorageError(f"{url}: {detail}")
